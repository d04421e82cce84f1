"""Packer templates of pre-pulled node images (`poolctl.image_templates`), rendered by
`poolctl.images` with jinja2 (StrictUndefined)."""
