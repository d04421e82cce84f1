"""Node images on GCP (part of `GcpOps`): the images `poolctl image build` made for the pool
(by its labels) and what uses them, and their deletion."""

from __future__ import annotations

import uuid

from poolctl import naming
from poolctl.adaptors.gcp import compute_v1
from poolctl.clouds.base import ImageRow, KeepsNodeImages
from poolctl.clouds.gcp.api import link_name
from poolctl.clouds.gcp.mig import MigReader
from poolctl.config import Config, Pool


class GcpImages(MigReader, KeepsNodeImages):
    def node_images(self, cfg: Config, pool: Pool) -> list[ImageRow]:
        labels = naming.gcp_labels(cfg, pool)
        assert pool.gcp is not None  # listed for the pool's gcp placement (one_target)
        project = pool.gcp.project
        # Label values are [a-z0-9_-] (naming.gcp_labels): nothing to escape in the quotes.
        flt = " AND ".join(f'labels.{k} = "{v}"' for k, v in sorted(labels.items()))
        images = self.call(f"list images of {project}", self.client("ImagesClient").list,
                           request=compute_v1.ListImagesRequest(project=project, filter=flt))
        used: dict[str, list[str]] = {}
        if pool.gcp.image:
            used.setdefault(link_name(pool.gcp.image), []).append("gcp.image in the file")
        # The pool's instance templates: the MIG's current one and the one a rollback
        # returns to (rollout cleanup keeps those and what VMs still run).
        for tpl in self.labelled_templates(project, labels):
            for d in tpl.properties.disks:
                if src := d.initialize_params.source_image:
                    used.setdefault(link_name(src), []).append(f"instance template {tpl.name}")
        return [ImageRow(id=f"projects/{project}/global/images/{im.name}", name=im.name,
                         created=im.creation_timestamp,
                         serving_image=dict(im.labels).get(naming.LABEL_SERVING_IMAGE),
                         in_use=used.get(im.name, []))
                for im in images]

    def delete_node_image(self, pool: Pool, row: ImageRow) -> None:
        what = f"delete image {row.name}"
        assert pool.gcp is not None  # prune: the pool's gcp placement, whose images it listed
        # A request id: a retried delete is not applied twice.
        op = self.call(what, self.client("ImagesClient").delete_unary,
                       request=compute_v1.DeleteImageRequest(
                           project=pool.gcp.project, image=row.name,
                           request_id=str(uuid.uuid4())))
        self.wait(op, pool.gcp.project, None, what)
