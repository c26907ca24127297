"""Where the command finds a cluster when `--endpoints` and $QUORUMLOG_ENDPOINTS are unset.

After `quorumlog dev up`, the local cluster's state file names its endpoints, so commands
run from the same directory reach it without an export; otherwise etcd's client port.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

FALLBACK_ENDPOINTS = "127.0.0.1:2379"
DEV_STATE_FILE = "dev-cluster.json"
DEV_DIRECTORY_DEFAULT = ".quorumlog-dev"


def default_endpoints() -> str:
    directory = os.environ.get("QUORUMLOG_DEV_DIR", DEV_DIRECTORY_DEFAULT)
    state_path = Path(directory) / DEV_STATE_FILE
    try:
        state = json.loads(state_path.read_text())
    except (OSError, ValueError):
        return FALLBACK_ENDPOINTS
    endpoints = state.get("endpoints") if isinstance(state, dict) else None
    return endpoints if isinstance(endpoints, str) and endpoints else FALLBACK_ENDPOINTS
