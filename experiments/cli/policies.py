"""`specdepth policies`: every depth policy with its parameters and defaults."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("policies", help="list depth policies, their parameters and defaults")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from specdepth.policies.registry import list_policies
    rows = list_policies()
    width = max(len(name) for name, _, _ in rows)
    for name, params, doc in rows:
        spec = ",".join(f"{k}={v}" for k, v in params.items())
        print(f"{name:<{width}}  {doc}")
        if spec:
            print(f"{'':<{width}}    {name}:{spec}")
    print("\nuse --policy NAME or NAME:key=value,...; your own: --policy mypkg.mod:MyPolicy "
          "(or register an entry point in the 'specdepth.policies' group)")
    return 0
