"""Published MLPerf Training results: the llama2_70b_lora table the HTML report shows (time to train,
minutes; olympic mean of 10 runs, from the MLCommons results repositories,
github.com/mlcommons/training_results_v4.0 ... v5.1, results/*/llama2_70b_lora/result_*.txt), and the
reader of submission folders behind `trainperf import` (each result_*.txt as a run of its engine)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from trainperf.core import flops as metrics
from trainperf.core.errors import SpecError
from trainperf.core.hardware import GPU_GENERATIONS, gpu_generation, peak_flops_for
from trainperf.core.untrusted import (check_inside, finite_number, load_untrusted_json, printable, read_untrusted_bytes,
                                      split_lines, whole_number)
from trainperf.core.spec import RunSpec
from trainperf.mlperf.benchmark import NEMO_LAYOUT_VARIABLES
from trainperf.mlperf.benchmarks import benchmark as benchmark_named
from trainperf.mlperf.benchmarks import find, runnable


SOURCE = "MLCommons training_results_v4.0-v5.1, llama2_70b_lora (github.com/mlcommons/training_results_v4.x/v5.x, results/*/llama2_70b_lora/result_*.txt)"

# (round, org, system, accelerator, GPUs, GBS, minutes)
LLAMA2_70B_LORA = [
    ("v4.1", "NVIDIA", "Eos 1xDGX H100 (NeMo, FP8)", "H100", 8, 8, 27.93),
    ("v4.1", "Supermicro", "AS-8125GS-TNHR", "H100", 8, 8, 27.54),
    ("v4.0", "JuniperNetworks", "H100_n1 (HF + DeepSpeed)", "H100", 8, 8, 116.09),
    ("v4.1", "NVIDIA", "DGX H200 (NeMo, FP8)", "H200", 8, 8, 24.12),
    ("v4.1", "Lenovo", "SR680a V3", "H200", 8, 8, 23.06),
    ("v5.0", "Supermicro", "AS-4125GS-TNHR2-LCC", "H200", 8, 8, 23.08),
    ("v5.1", "Dell", "1xXE9680x8H200", "H200", 8, 8, 23.37),
    ("v5.1", "Krai", "HPE Cray XD670 n2", "H200", 16, 8, 12.45),
    ("v5.1", "Krai", "HPE Cray XD670 n4", "H200", 32, 8, 6.83),
    ("v4.1", "NVIDIA", "Eos_n8", "H100", 64, 8, 4.57),
    ("v5.1", "Krai", "HPE Cray XD670 n8", "H200", 64, 16, 4.41),
    ("v4.1", "Azure", "ND_H200_v5 x64", "H200", 512, 64, 1.61),
    ("v4.1", "NVIDIA", "Eos_n128", "H100", 1024, 128, 1.19),
]
# the published tables the report shows beside comparable runs, by benchmark
PUBLISHED_TABLES = {"llama2_70b_lora": LLAMA2_70B_LORA}


# ---------------------------------------------------------------------------------------------
# Reading MLPerf submission folders: <org>/results/<system>/<benchmark>/result_*.txt, the system's
# <org>/systems/<system>.json and the implementation's config scripts that set the layout (NeMo's
# logs do not echo it)


EXPORT_LINE = re.compile(r"^\s*export\s+([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
SOURCE_LINE = re.compile(r"^\s*source\s+.*?/?([A-Za-z0-9_.-]+\.sh)\s*$")  # source $(dirname ${BASH_SOURCE[0]})/x.sh
DEFAULT_LINE = re.compile(r'^\s*:\s*"\$\{([A-Za-z_][A-Za-z0-9_]*):=([^}]*)\}"')
# the config variables that name each layout field, first found wins: a benchmark's own
# (Benchmark.layout_variables), these where none is given
LAYOUT_VARIABLES = NEMO_LAYOUT_VARIABLES


@dataclass
class ImportedRun:
    """One published run, as the store keeps it (``row``), or why it could not be read (``missing``)."""

    path: str
    engine: str = ""
    row: dict = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    where: str = ""  # round/org/results/system/benchmark, escaped for printing
    sha256: str = ""  # of the log's bytes: the same log under another folder is the same run
    legacy_run_id: str = ""  # the id earlier versions gave it (from its folder), to find it stored


def _shell_value(raw: str) -> str:
    """The literal of ``export K=V``: quotes and trailing comments dropped, ``${K:=V}`` defaults taken."""
    raw = raw.split(" #")[0].strip().rstrip(";").strip()
    m = re.fullmatch(r'"?\$\{[A-Za-z_0-9]+:=([^}]*)\}"?', raw)
    return (m.group(1) if m else raw).strip("\"'")


MAX_CONFIG_BYTES = 1024 * 1024
MAX_CONFIG_LINE = 4096  # the lazy source pattern is quadratic in a line's length; real lines are < 200
MAX_SOURCE_DEPTH = 16


def read_config_script(path: Path, commons: list[Path], seen: set | None = None, root: Path | None = None,
                       depth: int = 0) -> dict[str, str]:
    """The exported variables of a config script and those it sources (a sourced file missing beside
    it is looked for among ``commons``, the config_common.sh of the benchmark's implementations);
    later assignments win, as in bash. Read as text only, never run: a regular file inside ``root``
    (when given) of at most MAX_CONFIG_BYTES, lines of at most MAX_CONFIG_LINE characters; a sourced
    file is found by name among the files beside it, never by a path built from the script."""
    seen = seen if seen is not None else set()
    if path in seen:
        return {}
    if depth > MAX_SOURCE_DEPTH:
        raise SpecError(f"config script {printable(path)} sources scripts more than {MAX_SOURCE_DEPTH} deep")
    seen.add(path)
    data = read_untrusted_bytes(path, max_bytes=MAX_CONFIG_BYTES, root=root, what="config script")
    out: dict[str, str] = {}
    for line in split_lines(data.decode("utf-8", errors="replace"), max_chars=MAX_CONFIG_LINE,
                            where=f"config script {path}"):
        if m := SOURCE_LINE.match(line):
            name = m.group(1)
            listing = path.parent.iterdir() if path.parent.is_dir() else ()
            beside = [p for p in listing if p.name == name and p.is_file()]
            sourced = beside[0] if beside else next((c for c in commons if c.name == name), None)
            if sourced is not None:
                out.update(read_config_script(sourced, commons, seen, root, depth + 1))
        elif m := EXPORT_LINE.match(line) or DEFAULT_LINE.match(line):
            out[m.group(1)] = _shell_value(m.group(2))
    return out


def _first_int(env: dict[str, str], names: tuple[str, ...]) -> int | None:
    """The first of ``names`` set to a number (truncated, as before), None when none is; a number that
    is not finite or outside 0..1,000,000 is a SpecError (no layout has such a degree)."""
    for name in names:
        try:
            number = float(env[name])
        except (KeyError, ValueError):
            continue
        return int(finite_number(number, f"{name}={printable(env[name], 40)}", lo=0, hi=1_000_000))
    return None


def _truthy(value: str | None) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes")


def config_layout(env: dict[str, str], gpus: int, variables: dict | None = None) -> dict:
    """Layout fields from a config's variables (``variables``: the benchmark's, LAYOUT_VARIABLES if none):
    tp, pp, cp, vp, sp, mbs, dp, the per-DP-rank batch, and any degree a benchmark adds (ep; 1 unset)."""
    got = {k: _first_int(env, names) for k, names in (variables or LAYOUT_VARIABLES).items() if k != "sp"}
    tp, pp, cp = got["tp"] or 1, got["pp"] or 1, got["cp"] or 1
    dp = gpus // (tp * pp * cp) if gpus % (tp * pp * cp) == 0 else 0
    # Megatron turns sequence parallelism on with TP unless the script says SP=0
    sp = tp > 1 and (_truthy(env["SP"]) if "SP" in env else True)
    return {"tp": tp, "pp": pp, "cp": cp, "vp": got["vp"] or 1, "sp": sp, "mbs": got["mbs"] or 1, "dp": dp,
            "local_batch": got["local_batch"], "nodes": got["nodes"],
            "fp8": _truthy(env.get("FP8")), "fp8_attention": _truthy(env.get("FP8_DPA")),
            **{k: v or 1 for k, v in got.items() if k not in LAYOUT_VARIABLES}}


def submission_org_dirs(path: Path) -> list[Path]:
    """The <org> folders (holding results/) at ``path`` or up to two levels below it (a round's
    folder holds several orgs)."""
    found = []
    for depth in range(3):
        pattern = "/".join(["*"] * depth)
        for d in sorted([path] if depth == 0 else path.glob(pattern)):
            if d.is_dir() and (d / "results").is_dir():
                found.append(d)
        if found:
            return found
    return found


def round_name(org_dir: Path) -> str | None:
    """The round of the folder above an org: v4.1 for a folder named v4.1 or ending in it (a checkout of
    mlcommons/training_results_v4.1), else None."""
    m = re.search(r"(?:^|[_-])v(\d+)\.(\d+)$", org_dir.parent.name)
    return f"v{m.group(1)}.{m.group(2)}" if m else None


def ruleset_of_round(name: str) -> str:
    """The training ruleset of a round: v4.1 -> 4.1.0."""
    return f"{name.lstrip('v')}.0"


def round_ruleset(org_dir: Path, default: str) -> str:
    """The training ruleset of the round folder above an org (v4.1 -> 4.1.0), else ``default``."""
    name = round_name(org_dir)
    return ruleset_of_round(name) if name else default


# the engines a submission's folder or framework description may name, the more specific first
ENGINE_WORDS = ("nemo", "megatron", "deepspeed", "llmboost", "maxtext", "paxml", "jax", "pytorch", "tensorflow", "mxnet")


def engine_name(config: Path | None, system: dict) -> str:
    """The engine a submission ran: its implementation folder's last word when that names an engine
    (benchmarks/<benchmark>/implementations/eos_n8_ngc24.09_nemo: nemo), else the first engine the
    system description's framework names (NeMo before PyTorch), else that folder's last word."""
    parts = config.parent.parts if config else ()
    implementation = parts[parts.index("implementations") + 1] if "implementations" in parts[:-1] else \
        (config.parent.name if config else "")
    folder_word = re.split(r"[_\s]", implementation.strip())[-1].lower() if implementation else ""
    if folder_word in ENGINE_WORDS:
        return folder_word
    framework = f"{system.get('framework', '')} {system.get('framework_name', '')}".lower()
    named = [w for w in ENGINE_WORDS if re.search(rf"\b{w}\b", framework)]
    if named:
        return named[0]
    return printable(folder_word, 40) if folder_word and not re.fullmatch(r"n?\d+", folder_word) else ""


def compliance_failure(log, ruleset: str) -> str | None:
    """The compliance checker's first complaint about a parsed log (None when it passes), as its
    check_file would report it. The log's names must have passed mlperf.log.check_log_names; the
    checker is kept to the package's own rule files all the same (checker_rule_file)."""
    # the package's own checker, in-process (the CLI form spawns an interpreter per log)
    from mlperf_logging.compliance_checker import mlp_compliance

    # the same package's guards and logging capture, loaded with the checker
    from trainperf.mlperf.log import check_ruleset, checker_rule_file
    from trainperf.mlperf.score import captured_logging

    check_ruleset(ruleset, "ruleset")

    class PackageRulesOnly(mlp_compliance.ComplianceChecker):
        def configured_checks(self, loglines, config_file):
            # a rule file is code the checker execs: only the package's own, whatever a log names
            real = checker_rule_file(os.path.relpath(config_file, os.path.dirname(mlp_compliance.__file__)))
            if os.path.isfile(real):  # a missing one is already the checker's "Could not find config file"
                return super().configured_checks(loglines, real)
            return None

    checker = PackageRulesOnly("training", ruleset, True, False)
    if log.errors:
        checker.put_message("Log lines had parsing errors.")
    # the package queues rule files in a module-level list: start empty, and leave nothing behind
    mlp_compliance.enqueued_configs.clear()
    try:
        with captured_logging() as records:
            checker.check_loglines(log.loglines, f"training_{ruleset}/common.yaml")
    except SpecError:
        raise
    except Exception as exc:  # noqa: BLE001 -- its rules evaluate the log's values unguarded in places
        return printable(f"its rules could not evaluate this log ({type(exc).__name__}: {exc})", 200)
    finally:
        mlp_compliance.enqueued_configs.clear()
    if not checker.has_messages():
        return None
    messages = [*checker.overwritable.values(), *checker.not_overwritable] or [r.getMessage() for r in records]
    return printable(" ".join(str(messages[0]).split()), 200) if messages else "failed"


# the tracked_stats trainperf reads a step time from; each value used must be a finite positive number
STEP_STATS = ("train_step_time", "train_step_timing in s", "throughput")


def tracked_stats(loglines: list, where: str = "MLPerf log",
                  file_lines: list[int] | None = None) -> dict[str, list[float]]:
    """The log's tracked_stats values by name, in order, and max_sequence_length when logged; a step
    statistic (STEP_STATS) that is not a finite positive number, or a sequence length outside
    1..10,000,000, is a SpecError naming the line."""
    out: dict[str, list[float]] = {}
    numbers = file_lines or [getattr(ll, "lineno", 0) + 1 for ll in loglines]
    for ll, no in zip(loglines, numbers):
        v = ll.value if isinstance(ll.value, dict) else {}
        if ll.key == "tracked_stats" and isinstance(v.get("value"), dict):
            for name, x in v["value"].items():
                if name in STEP_STATS:
                    out.setdefault(name, []).append(
                        finite_number(x, f"{printable(where)} line {no}: tracked_stats.{printable(name, 40)}",
                                      lo=0, lo_open=True))
                elif isinstance(x, (int, float)) and not isinstance(x, bool):
                    out.setdefault(name, []).append(float(x))
        elif ll.key == "max_sequence_length" and isinstance(v.get("value"), int):
            out["max_sequence_length"] = [float(whole_number(v["value"], f"{printable(where)} line {no}: "
                                                             "max_sequence_length", lo=1, hi=10_000_000))]
    return out


def step_seconds_from_stats(stats: dict[str, list[float]], gbs: int) -> tuple[float | None, str]:
    """(seconds per optimizer step, what it came from): the median logged step time; else GBS over
    the median logged throughput (samples/s: what NeMo's LoRA callback logs); None if neither."""
    for key in ("train_step_time", "train_step_timing in s"):
        if stats.get(key):
            return statistics.median(stats[key]), f"median tracked_stats.{key}"
    if stats.get("throughput"):
        return gbs / statistics.median(stats["throughput"]), "GBS / median tracked_stats.throughput (samples/s)"
    return None, ""


def step_seconds_from_blocks(loglines: list, gbs: int, seq_len: int) -> tuple[float | None, str]:
    """(seconds per optimizer step, what it came from) from the training blocks of a log that tracks no
    throughput (NeMo's logs before v4.1): each block_start .. block_stop covers ``epoch_count``
    sequences -- or tokens, where the count is a whole number of GBS x sequence length (gpt3's logs
    count tokens) -- so a step lasts the block's time over its steps. The median over the blocks, the
    first left out (it holds the compilation and warm-up); None without two whole blocks of steps."""
    starts, rates = {}, []
    for ll in loglines:
        meta = ll.value.get("metadata", {}) if isinstance(ll.value, dict) else {}
        first, count = meta.get("first_epoch_num"), meta.get("epoch_count")
        if isinstance(first, bool) or not isinstance(first, (int, float, str)):
            continue  # only a scalar names a block
        if ll.key == "block_start":
            starts[first] = ll.timestamp
        elif ll.key == "block_stop" and first in starts and isinstance(count, (int, float)) and 0 < count < 1e15:
            per_step = gbs * seq_len if seq_len and count % (gbs * seq_len) == 0 else gbs
            if count % per_step == 0 and ll.timestamp > starts[first]:
                rates.append((ll.timestamp - starts[first]) / 1000 / (count // per_step))
    if len(rates) < 2:
        return None, ""
    return statistics.median(rates[1:]), f"median training block time per step ({len(rates) - 1} blocks, the first left out)"


def implementation_configs(org_dir: Path, benchmark: str) -> tuple[list[Path], list[Path]]:
    """(the config_*.sh of every implementation of the benchmark, the config_common.sh among them):
    anywhere under benchmarks/<benchmark>/ (most submitters keep them in implementations/<name>/,
    some in a folder of their own beside it)."""
    bench = org_dir / "benchmarks" / benchmark
    scripts = sorted(bench.rglob("config_*.sh")) if bench.is_dir() else []
    return [s for s in scripts if "common" not in s.name], [s for s in scripts if "common" in s.name]


def config_affinity(config: Path, system_name: str) -> int:
    """How closely a config's place and name point at a system: 2 in a folder named after it, 1 when its
    file name carries the system's model word (XE8640 of XE8640x4H100-SXM-80GB), else 0."""
    if system_name in (config.parent.name, config.parent.parent.name):
        return 2
    words = {w.lower() for w in re.findall(r"[A-Za-z]{2,}\d{3,}", system_name)}
    return 1 if any(w in config.name.lower() for w in words) else 0


GPU_FAMILIES = GPU_GENERATIONS  # GPU model -> generation (core.hardware parses the names)


def named_gpu_family(text: str) -> str | None:
    """The GPU generation a name mentions (config_XE9680L_B200.sh: blackwell), None if it names none."""
    return gpu_generation(text)


def matching_config(configs: list[Path], commons: list[Path], system_name: str, gpus: int, nodes: int,
                    gbs: int, per_node: int | None = None, accelerator: str = "",
                    root: Path | None = None, variables: dict | None = None) -> tuple[Path | None, dict, str]:
    """The config that ran this system: a launch config (it sets DGXNNODES or DGXNGPU; fragments such as
    config_fp8.sh do not) whose nodes, GPUs per node and per-rank batch x data-parallel ranks agree with
    the system and the log's GBS; the closest to the system first (config_affinity). (path, layout, why
    none) -- the layout of a config that contradicts the log is not used."""
    candidates = sorted(configs, key=lambda c: -config_affinity(c, system_name))
    reasons = []
    for path in candidates:
        env = read_config_script(path, commons, root=root)
        try:
            lay = config_layout(env, gpus, variables)
            node_gpus = _first_int(env, ("DGXNGPU",))
        except SpecError as exc:
            raise SpecError(f"config script {printable(path)}: {exc}") from None
        if lay["nodes"] is None and node_gpus is None:
            continue  # a fragment another config sources, not a run's config
        family = named_gpu_family(path.name)
        if family and accelerator and named_gpu_family(accelerator) not in (None, family):
            reasons.append(f"{printable(path.name)}: written for {family} GPUs, the system has {accelerator}")
            continue
        if lay["nodes"] not in (None, nodes):
            reasons.append(f"{printable(path.name)}: DGXNNODES={lay['nodes']}, the system has {nodes} nodes")
            continue
        if per_node and node_gpus not in (None, per_node):
            reasons.append(f"{printable(path.name)}: DGXNGPU={node_gpus}, the system has {per_node} GPUs per node")
            continue
        if not lay["dp"]:
            reasons.append(f"{printable(path.name)}: TP{lay['tp']} PP{lay['pp']} CP{lay['cp']} does not divide "
                           f"{gpus} GPUs")
            continue
        if lay["local_batch"] is not None and lay["local_batch"] * lay["dp"] != gbs:
            reasons.append(f"{printable(path.name)}: MINIBS {lay['local_batch']} x DP {lay['dp']} = "
                           f"{lay['local_batch'] * lay['dp']}, the log's global_batch_size is {gbs}")
            continue
        return path, lay, ""
    return None, {}, "; ".join(reasons) or "no config_*.sh under benchmarks/<benchmark>/"


def recipe_spec(benchmark: str, gbs: int) -> RunSpec:
    """The benchmark's recipe (at this GBS where its rules derive the schedule from the GBS)."""
    return benchmark_named(benchmark).defaults(gbs)


def run_spec(benchmark: str, gbs: int, seq_len: int | None, lay: dict) -> RunSpec:
    """The run as a trainperf spec: the benchmark's recipe at this GBS with the published layout."""
    spec = recipe_spec(benchmark, gbs)
    spec.train.global_batch_size, spec.train.micro_batch_size = gbs, lay["mbs"]
    if seq_len:
        spec.data.seq_len = seq_len
    p = spec.parallel
    p.tp, p.pp, p.cp, p.sp = lay["tp"], lay["pp"], lay["cp"], lay["sp"]
    p.dp_replicate, p.dp_shard = 1, lay["dp"]
    if lay["pp"] > 1:
        p.pp_schedule = "Interleaved1F1B" if lay["vp"] > 1 else "1F1B"
        p.pp_stages_per_rank = lay["vp"] if lay["vp"] > 1 else 0
    spec.hardware.device = "cuda"
    spec.hardware.fp8 = "tensorwise" if lay["fp8"] else "none"
    # none of the configs asks for activation recomputation (Megatron's default is none), and an FP8
    # LoRA run keeps its frozen base in FP8 (Transformer Engine's fp8 weights)
    spec.train.recompute = "none"
    if spec.lora.enabled and lay["fp8"]:
        spec.hardware.frozen_dtype = "fp8"
    spec.mlperf.comparable = False  # another engine's run: compared, not scored as ours
    return spec


def read_submissions(paths: list[str], default_ruleset: str) -> tuple[list[ImportedRun], list[str]]:
    """Every result_*.txt of the submission folders at ``paths``: (runs that are complete, one line per
    thing that stopped a folder or a log from being imported). A run is complete with its benchmark,
    GPUs, layout (from the config that matches it), GBS, step time or throughput and a passing
    compliance check; anything short of that is reported, not stored in part.

    Every file is read as untrusted (docs/TRUST.md): a file that is not a regular one, a link out of the
    folder given, an oversized file or line, malformed JSON or records, a name outside its allow-list
    or a number that cannot be is a SpecError (one line, nothing stored), raised before any of
    mlperf_logging's checkers sees the log. A run's id is the hash of its log's bytes: the same log
    under another folder is the same run."""
    # mlperf_logging loads only when an import runs (report imports this module for its table)
    from trainperf.mlperf.log import check_ruleset, training_rulesets

    check_ruleset(default_ruleset)
    installed = training_rulesets()
    runs, problems = [], []
    for raw in paths:
        path = Path(raw)
        orgs = submission_org_dirs(path) if path.is_dir() else []
        if not orgs:
            problems.append(f"{printable(raw)}: not an MLPerf submission folder (expected <org>/results/<system>/"
                            "<benchmark>/result_*.txt, or a round folder holding such orgs)")
        for org_dir in orgs:
            check_inside(org_dir, path, "submission folder")
            ruleset = round_ruleset(org_dir, default_ruleset)
            if ruleset not in installed:
                problems.append(f"{printable(org_dir.parent.name)}/{printable(org_dir.name)}: the installed "
                                f"mlperf_logging has no training ruleset {ruleset} for round {round_name(org_dir)} "
                                f"(it has {', '.join(installed)})")
                continue
            for bench_dir in sorted(p for p in (org_dir / "results").glob("*/*") if p.is_dir()):
                check_inside(bench_dir, path, "results folder")
                got, missing = read_benchmark_dir(org_dir, bench_dir, ruleset, root=path)
                runs += got
                problems += missing
    return runs, problems


MAX_SYSTEM_BYTES = 1024 * 1024
# the system description fields read as names; each must be text when present
SYSTEM_TEXT = ("system_name", "accelerator_model_name", "framework", "framework_name", "host_networking",
               "accelerator_interconnect")


def read_system(sys_file: Path, root: Path | None, where: str) -> tuple[dict | None, str]:
    """(the system description's fields trainperf reads, why none): a missing file or field is a reason;
    a file that is not a regular one inside ``root``, not JSON, too deep or big, or a field of the wrong
    type or out of range is a SpecError."""
    if not sys_file.exists() and not sys_file.is_symlink():
        return None, f"{where}: no system description systems/{printable(sys_file.name)}"
    system = load_untrusted_json(sys_file, max_bytes=MAX_SYSTEM_BYTES, root=root, what="system description")
    shown = f"system description {printable(sys_file)}"
    if not isinstance(system, dict):
        raise SpecError(f"{shown}: a JSON {type(system).__name__} where an object belongs")
    absent = [k for k in ("number_of_nodes", "accelerators_per_node", "accelerator_model_name") if k not in system]
    if absent:
        return None, f"{where}: system description {printable(sys_file.name)} incomplete (no {', '.join(absent)})"
    for k in SYSTEM_TEXT:
        if k in system and not isinstance(system[k], str):
            raise SpecError(f"{shown}: {k} is a JSON {type(system[k]).__name__}, not text")
    out = {k: printable(system[k]) for k in SYSTEM_TEXT if k in system}
    out["number_of_nodes"] = whole_number(system["number_of_nodes"], f"{shown}: number_of_nodes", lo=1, hi=100_000)
    out["accelerators_per_node"] = whole_number(system["accelerators_per_node"], f"{shown}: accelerators_per_node",
                                                lo=1, hi=1024)
    return out, ""


def read_benchmark_dir(org_dir: Path, bench_dir: Path, ruleset: str,
                       root: Path | None = None) -> tuple[list[ImportedRun], list[str]]:
    """The runs of one results/<system>/<benchmark> folder, or why they cannot be imported."""
    # mlperf_logging loads only when an import runs
    from trainperf.mlperf.log import ruleset_benchmarks

    system_name, benchmark = bench_dir.parent.name, bench_dir.name
    where = "/".join(printable(p) for p in (round_name(org_dir) or org_dir.parent.name, org_dir.name, "results",
                                            system_name, benchmark))
    logs = sorted(bench_dir.glob("result_*.txt"), key=lambda p: [int(t) if t.isdigit() else t
                                                                 for t in re.split(r"(\d+)", p.name)])
    if not logs:
        return [], [f"{where}: no result_*.txt"]
    known = runnable()  # a benchmark whose model trainperf lacks cannot be priced
    if benchmark not in known:
        return [], [f"{where}: benchmark {printable(repr(benchmark))} has no trainperf recipe "
                    f"(known: {', '.join(known)})"]
    allowed = sorted(set(known) & set(ruleset_benchmarks(ruleset)))
    if benchmark not in allowed:
        return [], [f"{where}: {benchmark} is not an MLPerf training {ruleset} benchmark (it has {', '.join(allowed)})"]
    system, why = read_system(org_dir / "systems" / f"{system_name}.json", root, where)
    if system is None:
        return [], [why]
    nodes, per_node = system["number_of_nodes"], system["accelerators_per_node"]
    configs, commons = implementation_configs(org_dir, benchmark)
    out, problems = [], []
    for log in logs:
        item = read_one_log(log, where, system, printable(system_name), benchmark, nodes, per_node,
                            system["accelerator_model_name"], configs, commons, ruleset, root=root,
                            allowed=allowed)
        (out.append(item) if not item.missing else problems.extend(item.missing))
    return out, problems


# a model FLOP rate above four times the GPU's dense bf16 peak (its 4-bit peak) is not a measurement;
# without a known peak, above 10 PFLOP/s per GPU
MAX_MFU = 4.0
MAX_FLOPS_PER_GPU = 1e16


def read_one_log(log: Path, where: str, system: dict, system_name: str, benchmark: str, nodes: int, per_node: int,
                 accelerator: str, configs: list[Path], commons: list[Path], ruleset: str, root: Path | None = None,
                 allowed: list[str] | None = None) -> ImportedRun:
    """One published run as a store row (``missing`` says what stopped it)."""
    # the log reader of `score` (mlperf_logging's parser), loaded only when an import runs
    from trainperf.mlperf.log import check_log_names, read_log
    from trainperf.mlperf.score import run_from_log

    item, label, gpus = ImportedRun(path=str(log), where=where), f"{where}/{printable(log.name)}", nodes * per_node
    parsed = read_log(log, ruleset, root=root)
    # before any checker: the values mlperf_logging would make a rule file's name of
    check_log_names(parsed, allowed or [benchmark])
    run = run_from_log(parsed)
    item.sha256 = parsed.sha256
    item.legacy_run_id = "imp-" + hashlib.sha1(f"{where}/{log.name}".encode()).hexdigest()[:12]
    if run.benchmark != benchmark:
        item.missing.append(f"{label}: logs submission_benchmark {run.benchmark!r} in a {benchmark} folder")
        return item
    failure = compliance_failure(parsed, ruleset)
    if failure:
        item.missing.append(f"{label}: fails the {ruleset} compliance checker: {failure}")
    gbs = whole_number(run.gbs, f"{label}: global_batch_size", lo=1, hi=100_000_000) if run.gbs is not None else 0
    if not gbs:
        item.missing.append(f"{label}: no global_batch_size logged")
    bench = find(benchmark)
    config, lay, why = matching_config(configs, commons, system_name, gpus, nodes, gbs, per_node, accelerator,
                                       root=root, variables=bench.layout_variables if bench else None)
    if config is None:
        item.missing.append(f"{label}: no config sets this run's layout ({why})")
    stats = tracked_stats(parsed.loglines, label, parsed.file_lines)
    seq = int(stats["max_sequence_length"][0]) if stats.get("max_sequence_length") else None
    step_s, basis = step_seconds_from_stats(stats, gbs) if gbs else (None, "")
    if step_s is None and gbs:
        step_s, basis = step_seconds_from_blocks(parsed.loglines, gbs, seq or recipe_spec(benchmark, gbs).data.seq_len)
    if step_s is None:
        item.missing.append(f"{label}: no throughput (no tracked_stats train_step_time or throughput, and not "
                            "two training blocks with an epoch_count of whole steps)")
    if item.missing:
        return item
    item.engine = engine_name(config, system) or "unknown"
    spec = run_spec(benchmark, gbs, seq, lay)
    seq = spec.data.seq_len
    step_s = finite_number(step_s, f"{label}: the step time from {basis}", lo=0, lo_open=True)
    tokens_per_s = finite_number(gbs * seq / step_s, f"{label}: tokens/s from {basis}", lo=0, lo_open=True)
    # MFU as for our runs: the model's own FLOPs against the dense bf16 peak (989 TFLOP/s for H100/H200)
    flops = metrics.train_flops_per_token(spec.model, spec.lora, seq) * tokens_per_s / gpus
    peak = peak_flops_for(accelerator)
    mfu = metrics.mfu(1.0, flops, peak)
    if (mfu is not None and mfu > MAX_MFU) or flops > MAX_FLOPS_PER_GPU:
        raise SpecError(f"{label}: {basis} gives {flops / 1e12:,.4g} model TFLOP/s per GPU"
                        + (f" ({mfu:.3g} x the GPU's bf16 peak)" if mfu is not None else "")
                        + ": not a throughput a GPU can reach; refused")
    minutes = run.minutes if run.success else None
    item.row = {
        "run_id": "imp-" + parsed.sha256[:16],
        "created_at": (run.run_start_ms or 0.0) / 1000, "finished_at": (run.run_stop_ms or 0.0) / 1000 or None,
        "workload": benchmark, "status": "success" if run.success else "failed",
        "status_reason": None if run.success else printable(run.failure), "division": run.division, "comparable": 0,
        "spec_json": json.dumps(spec.to_dict(), sort_keys=True), "layout": layout_label(lay), "world_size": gpus,
        "hardware_json": json.dumps({"device": "cuda", "gpu": accelerator, "gpus": gpus, "nodes": nodes,
                                     "gpus_per_node": per_node, "system": system.get("system_name", system_name),
                                     "network": system.get("host_networking", ""),
                                     "interconnect": system.get("accelerator_interconnect", "")}),
        "software_json": json.dumps({"framework": system.get("framework", ""), "org": submitter(run.org, where),
                                     "round": Path(where).parts[0], "ruleset": ruleset,
                                     "config": printable(config, 1000),
                                     "step_time_basis": basis, "log_sha256": parsed.sha256,
                                     "precision": ("fp8" + (" (+fp8 attention)" if lay["fp8_attention"] else ""))
                                     if lay["fp8"] else "bf16"}),
        "time_to_train_s": minutes * 60 if minutes is not None else None,
        "samples_to_target": run.samples_to_converge, "step_time_s": step_s, "tokens_per_s": tokens_per_s,
        "tokens_per_s_per_gpu": tokens_per_s / gpus, "model_tflops_per_gpu": flops / 1e12,
        "mfu": mfu, "out_dir": str(log.parent), "mllog_path": str(log),
        "engine": item.engine,
    }
    return item


def submitter(logged_org: str | None, where: str) -> str:
    """The submitting organisation: as logged, unless the log kept the template's placeholder
    (SUBMISSION_ORG_PLACEHOLDER) or none, then the org folder's name."""
    if logged_org and "placeholder" not in logged_org.lower():
        return printable(logged_org)
    return Path(where).parts[1]


def layout_label(lay: dict) -> str:
    """NVIDIA's layout in the store's words: TP4 SP CP2 PP8 (VP6) DP8 MBS 2."""
    parts = [f"TP{lay['tp']}" + (" SP" if lay["sp"] else "")] if lay["tp"] > 1 else []
    parts += [f"CP{lay['cp']}"] if lay["cp"] > 1 else []
    parts += [f"PP{lay['pp']}" + (f" VP{lay['vp']}" if lay["vp"] > 1 else "")] if lay["pp"] > 1 else []
    return " ".join(parts + [f"DP{lay['dp']}", f"MBS {lay['mbs']}"])
