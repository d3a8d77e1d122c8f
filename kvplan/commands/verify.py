"""`kvplan verify DIR`: check a result set against its manifest.json (every file there with its size and SHA-256,
nothing else). A missing, corrupt or foreign manifest, a file changed, missing or added: one line naming the file
and what is wrong, exit 2."""

from __future__ import annotations

import argparse
from pathlib import Path

from kvplan.output import print_json, verify_result_set


def register(verbs: argparse._SubParsersAction) -> None:
    p = verbs.add_parser("verify", help="check a result set against its manifest.json", description=__doc__)
    p.add_argument("dir", type=Path, help="a result set: the --out of simulate, replay, validate or run")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    manifest = verify_result_set(args.dir)
    doc = {"dir": str(args.dir), "files": len(manifest["files"]), "kvplan_version": manifest["kvplan_version"],
           "created": manifest.get("created"), "config_sha256": manifest.get("config_sha256")}
    if args.json:
        print_json(doc)
    else:
        print(f"{args.dir}: a complete result set: {doc['files']} files, each as manifest.json lists it "
              f"(kvplan {doc['kvplan_version']}, {doc['created']})")
    return 0
