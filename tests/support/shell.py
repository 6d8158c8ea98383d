"""`quire shell ...` run as an operator runs it: the CLI in a subprocess, JSON out."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sysconfig
from pathlib import Path

from shared.config import QuireSettings

QUIRE = Path(sysconfig.get_path("scripts")) / "quire"


async def shell(settings: QuireSettings, *args: str) -> dict | list:
    """The command's JSON answer; it reads the bookie's files with `settings`' subject
    prefix and journal directories (as the operator's environment would give them)."""
    env = dict(
        os.environ,
        QUIRE_SUBJECT_PREFIX=settings.subject_prefix,
        QUIRE_JOURNAL__JOURNAL_DIRECTORIES=json.dumps(settings.journal.journal_directories),
    )
    proc = await asyncio.create_subprocess_exec(
        str(QUIRE),
        "shell",
        *args,
        "--data-dir",
        str(settings.data_dir),
        "--bookie-id",
        settings.bookie_id,
        "--output",
        "json",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    return json.loads(out)
