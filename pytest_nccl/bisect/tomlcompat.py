"""Reading TOML on every Python the package supports: the standard library's ``tomllib`` from 3.11 on,
its backport ``tomli`` on 3.10 (a dependency there: pyproject.toml)."""

from __future__ import annotations

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

loads = tomllib.loads
TOMLDecodeError = tomllib.TOMLDecodeError
