"""The gateway child of `tgictl launch --replicas N`: the SGLang Model Gateway (SMG) router, started from
its Python package (the optional extra `tgictl[gateway]`) with what its command line cannot carry:

- the API key, read from TGICTL_API_KEY as the routers read it (a flag would show in `ps`); SMG then
  requires it from clients and sends it to the replicas;
- a control-plane key nobody knows: SMG's admin routes (register a worker by URL, flush the engines'
  caches, profiles) share the public port, and the launcher never uses them, so they stay closed;
- no banner: SMG prints one to stdout, which the launcher would relay line by line.

    python -m tgictl.runtime.launcher.gateway_process SMG_LAUNCH_ARGS...
"""

from __future__ import annotations

import secrets
import sys
from collections.abc import Sequence

from tgictl.env import read_env


def main(argv: Sequence[str]) -> None:
    from smg.launch_router import parse_router_args
    from smg.router import Router

    args = parse_router_args(list(argv))
    args.api_key = read_env().api_key
    args.control_plane_api_keys = [("tgictl-launch", "tgictl launch", secrets.token_urlsafe(32), "admin")]
    args._validate_router_args()
    Router.from_args(args).start()


if __name__ == "__main__":
    main(sys.argv[1:])
