"""mkdocs hook: publish the plots under results/ with the site, without copying them into docs/.

Each ``results/<study>/*.png`` becomes the site file ``results/<study>/<name>.png``, so a page links it as
``results/...`` relative to the docs root (``../results/...`` from ``studies/``), and ``mkdocs build --strict``
checks that link like any other.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[1]


def on_files(files, config):
    for png in sorted((ROOT / "results").glob("**/*.png")):
        uri = png.relative_to(ROOT).as_posix()
        if files.get_file_from_path(uri) is None:
            files.append(File(uri, src_dir=str(ROOT), dest_dir=config["site_dir"],
                              use_directory_urls=config["use_directory_urls"]))
    return files
