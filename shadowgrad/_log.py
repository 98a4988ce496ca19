"""Logging conventions: ``logging.getLogger(__name__)`` everywhere, and structured
events for the things operators count and alert on (promotion, resync, drops, ...).

An event is an ordinary log record whose ``extra`` carries ``event`` (a dotted name such as
``"shadow.drop"``) and ``fields`` (a JSON-serialisable dict). Human formatters show it as
``event key=value ...``; :class:`JsonFormatter` writes one JSON object per line. Only
``shadowgrad.cli.main`` configures handlers; library code never calls ``basicConfig``.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

__all__ = ["event", "JsonFormatter", "configure"]


def event(logger: logging.Logger, name: str, level: int = logging.INFO, **fields: Any) -> None:
    """Emit the structured event ``name`` with ``fields`` on ``logger``."""
    if not logger.isEnabledFor(level):
        return
    text = " ".join(f"{k}={v}" for k, v in fields.items())
    logger.log(level, "%s %s", name, text, extra={"event": name, "fields": fields}, stacklevel=2)


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, and event fields if any."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": record.levelname,
            "logger": record.name,
        }
        name = getattr(record, "event", None)
        if name is not None:
            out["event"] = name
            out.update(getattr(record, "fields", {}))
        else:
            out["msg"] = record.getMessage()
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, sort_keys=False)


def configure(level: str | int = "INFO", *, json_lines: bool = False) -> None:
    """Configure the root logger once, for command-line entry points only."""
    handler = logging.StreamHandler()
    if json_lines:
        handler.setFormatter(JsonFormatter())
    else:
        fmt = logging.Formatter(
            "%(asctime)s.%(msecs)03d %(levelname)-5s %(name)s: %(message)s", "%H:%M:%S"
        )
        fmt.converter = time.gmtime
        handler.setFormatter(fmt)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper() if isinstance(level, str) else level)
