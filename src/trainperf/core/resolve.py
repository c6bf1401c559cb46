"""Resolution of a run's spec, later layers winning:
  1. the workload's defaults (``trainperf.workloads``),
  2. an optional ``--config FILE`` (YAML or TOML, same ``section: {key: value}`` shape),
  3. repeated ``--set section.key=value`` overrides.
The named choices and value ranges are checked at once (``plan`` and ``tune`` price a spec without
the world size); the rest of validation is ``core.validate.validate``, before any process starts.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import tomllib

from trainperf.core.errors import SpecError
from trainperf.core.spec import SECTIONS, RunSpec, apply_section, set_value
from trainperf.core.untrusted import parse_untrusted_yaml, read_untrusted_text
from trainperf.core.validate import check_choices, check_values


def parse_override(text: str) -> tuple[str, str]:
    if "=" not in text:
        raise SpecError(f"--set {text!r}: expected section.key=value")
    key, value = text.split("=", 1)
    return key.strip(), value.strip()


def parse_error_text(exc: Exception) -> str:
    """'line L, column C: what' of a YAML or TOML parse error (the parser's first line when it gives no place)."""
    mark = getattr(exc, "problem_mark", None)  # PyYAML's MarkedYAMLError: 0-based line and column
    if mark is not None:
        what = getattr(exc, "problem", None) or type(exc).__name__
        return f"line {mark.line + 1}, column {mark.column + 1}: {what}"
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    at = re.search(r"\s*\(at line (\d+), column (\d+)\)", first)  # tomllib puts the place at the end
    if at:
        return f"line {at.group(1)}, column {at.group(2)}: {first[:at.start()] + first[at.end():]}"
    return first


def load_config_file(path: str) -> dict[str, Any]:
    p = Path(path)
    if p.is_dir():
        raise SpecError(f"config file {path!r} is a folder; give a .yaml, .yml or .toml file")
    if not p.exists():
        raise SpecError(f"config file {path!r} does not exist")
    text = read_untrusted_text(p, max_bytes=1024 * 1024, what="config file")
    try:
        if p.suffix.lower() == ".toml":
            data = tomllib.loads(text)
        elif p.suffix.lower() in (".yaml", ".yml"):
            data = parse_untrusted_yaml(text, where=f"config file {path}") or {}
        else:
            raise SpecError(f"config file {path!r}: expected a .yaml, .yml or .toml file")
    except SpecError:
        raise
    except Exception as exc:  # parser errors come in many classes
        raise SpecError(f"config file {path!r} could not be parsed: {parse_error_text(exc)}") from None
    if not isinstance(data, dict):
        raise SpecError(f"config file {path!r}: top level must be a mapping of sections")
    return data


def resolve_spec(base: RunSpec, config_file: str | None, overrides: list[str]) -> RunSpec:
    """Layer a config file and --set overrides over a workload's defaults."""
    spec = RunSpec.from_dict(base.to_dict())  # deep copy
    if config_file:
        for section, values in load_config_file(config_file).items():
            if section == "workload":  # the command names the workload; a file cannot change it
                if values != base.workload:
                    raise SpecError(f"config file {config_file!r}: workload: {values!r} differs from the workload "
                                    f"being run ({base.workload!r}); the workload is the command's argument, drop "
                                    "the key")
                continue
            if section not in SECTIONS:
                raise SpecError(f"config file {config_file!r}: unknown section {section!r}; valid: {', '.join(SECTIONS)}")
            apply_section(spec, section, values, source=f"config file {config_file!r}")
    for item in overrides:
        key, value = parse_override(item)
        set_value(spec, key, value)
    check_choices(spec)  # plan and tune price the spec without validate(): a misspelt name fails here
    check_values(spec)  # and a value out of its range
    return spec


