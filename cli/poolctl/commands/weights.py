"""poolctl weights manifest / verify: the manifest.json a node checks its copy of the weights
against (`poolctl.weights`); this module parses options and renders."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from poolctl.commands.common import JsonOpt, emit_json
from poolctl.errors import OperationFailed
from poolctl.progress import Progress
from poolctl.weights import manifest_path, write_manifest
from poolctl.weights import verify as check

if TYPE_CHECKING:
    from poolctl.progress import Progress

app = typer.Typer(help="The weights folder a pool's weights_uri holds, and its manifest.",
                  no_args_is_help=True)

FolderArg = Annotated[
    Path, typer.Argument(help="The folder with the model's weights (config, tokenizer, "
                         "safetensors ...), as it is or will be at weights_uri.",
                         show_default=False)
]


def _gb(n: int) -> str:
    return f"{n / 1e9:,.1f} GB" if n >= 1e8 else f"{n:,} bytes"


class _Hashed:
    """Progress of the hashing: `begin` (the library's `hashing`) says what there is to hash,
    then each thread reports its chunks (the library's `progress`), shown as a percentage."""

    def __init__(self, progress: Progress, line: str) -> None:
        self.progress, self.line = progress, line  # line.format(files=, size=)
        self.files = self.total = self.done = 0
        self._lock = threading.Lock()

    def begin(self, files: int, total: int) -> None:
        self.files, self.total = files, total
        self.progress.update(self.line.format(files=files, size=_gb(total)))

    def __call__(self, n: int) -> None:
        with self._lock:
            self.done += n
            pct = min(100, self.done * 100 // max(self.total, 1))
        self.progress.update(f"weights: {pct} % of {_gb(self.total)}", quiet=True)


OutOpt = Annotated[
    Path | None,
    typer.Option("--out", help="Write the manifest here instead (a read-only folder); upload "
                 "it as manifest.json beside the weights.", show_default=False),
]


@app.command()
def manifest(folder: FolderArg, out_file: OutOpt = None, json_out: JsonOpt = False) -> None:
    """Write FOLDER/manifest.json: every file's size and SHA-256, which each node checks its
    copy against before it serves. Run it before uploading the folder to weights_uri."""

    out_file = manifest_path(folder, out_file)  # refused before the folder is read
    with Progress() as progress:
        hashed = _Hashed(progress, f"weights: hashing {{files}} files, {{size}} in {folder}")
        out = write_manifest(folder, hashed, out_file, hashed.begin)
    files, size = hashed.files, hashed.total
    if json_out:
        emit_json({"manifest": str(out), "files": files, "bytes": size})
        return
    typer.echo(f"wrote {out}: {files} files, {_gb(size)}")
    if out.parent.resolve() == folder.resolve():
        typer.echo("Upload the folder with it to the pool's weights_uri, e.g.\n"
                   f"  aws s3 sync {folder} s3://BUCKET/PREFIX/\n"
                   f"  gcloud storage rsync -r {folder} gs://BUCKET/PREFIX/\n"
                   "and check a copy with `poolctl weights verify DIR`.")
    else:
        typer.echo("Upload the folder to the pool's weights_uri and the manifest as "
                   "manifest.json beside it, e.g.\n"
                   f"  aws s3 sync {folder} s3://BUCKET/PREFIX/ && "
                   f"aws s3 cp {out} s3://BUCKET/PREFIX/manifest.json\n"
                   "and check a copy with `poolctl weights verify DIR`.")


@app.command()
def verify(folder: FolderArg, json_out: JsonOpt = False) -> None:
    """Check FOLDER against its manifest.json as a node does before serving: every listed
    file there with its size and SHA-256. Exit 1 when one is not."""

    with Progress() as progress:
        hashed = _Hashed(progress, f"weights: checking {folder} against its manifest ({{size}})")
        result = check(folder, hashed, hashed.begin)
    if json_out:
        emit_json(result.to_json())
    else:
        for problem in result.problems:
            typer.echo(f"  {problem}")
        if result.unlisted:
            n = len(result.unlisted)
            typer.echo(f"{n} file{' is' if n == 1 else 's are'} not in the manifest (nodes "
                       f"copy them but do not check them): {', '.join(result.unlisted[:5])}"
                       + (" ..." if len(result.unlisted) > 5 else ""))
        typer.echo(f"{result.files - len(result.problems)} of {result.files} files verified "
                   f"({_gb(result.bytes)})")
    if not result.ok:
        raise OperationFailed(f"weights: {len(result.problems)} of {result.files} files in "
                              f"{folder} do not match its manifest.json; a node would refuse "
                              "them: copy them again, or write the manifest again if the "
                              "folder is right")
