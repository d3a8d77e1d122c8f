"""Fuzzing experiment YAML through `kvplan run --explain` (and the other YAML entry points: a synthetic spec through
`trace synth`, a cost profile through `simulate --profile`, `--retime` through `trace convert`): valid-ish
experiments with random values at every section, anchors and aliases (merge keys, recursive aliases, alias bombs
at any depth of any section), deep nesting, huge numbers, duplicate keys, unsafe tags, truncated and binary
documents. Every example must succeed or be refused with one line and exit 2, never a traceback, within bounded
time and memory: the whole suite runs in one child process under RLIMIT_AS and a timeout (bounded_child)."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.reliability import bounded_child

HERE = Path(__file__).resolve().parent
SUITE_TIMEOUT_S = 120.0  # the suite takes ~5-10 s here; a hang (an alias bomb read whole) would run forever

# Where a payload goes: every section of an experiment, including those the workload expands and serialises
# before checking them (workload.synthetic, workload.transforms).
SECTIONS = ("workload.synthetic", "workload.transforms", "workload.synthetic.lengths", "engine", "cluster",
            "sweep.grid", "search", "slo", "probe", "objective", "seeds", "description", "extra")
BASE = {"name": "fuzz", "model": "llama-3-8b", "hardware": "h100-sxm",
        "workload": {"synthetic": {"seed": 1, "requests": 20, "arrivals": {"process": "poisson", "rate": 2},
                                   "lengths": {"prompt": {"dist": "uniform", "min": 10, "max": 50},
                                               "output": {"dist": "uniform", "min": 5, "max": 20}}}},
        "search": {"target": "max_rate", "low": 0.5, "high": 8}, "slo": {"p99_ttft_ms": 1000}}
# A calibrated profile as `kvplan calibrate` writes one (the keys simulate requires, made-up coefficients).
PROFILE = {"model": "smollm2-135m", "device": "fuzz", "block_size": 1, "block_sizes": [1], "kv_capacity_blocks": 8192,
           "coefficients": {"step": 1e-4, "request": 7e-3, "prefill_tokens": 0.0, "prefill_attention": 3.6e-5,
                            "decode_requests": 0.0, "decode_context": 6.1e-6, "decode_context_max": 0.0,
                            "blocks_touched": 0.0, "sampled": 0.0, "batched": 0.0},
           "swap_seconds_per_block": 0.0, "copy_seconds_per_block": 0.0,
           "fit": {"steps": 431, "heldout_steps": 86, "r2": 0.98, "heldout_r2": 0.23,
                   "heldout_median_abs_error_pct": 8.6, "heldout_p90_abs_error_pct": 49.8}}
# The other YAML entry points, each with a document to damage and the keys to put payloads at.
SPEC = BASE["workload"]["synthetic"]  # type: ignore[index]
ENTRIES = {  # name -> (base document, sections, the command with {path})
    "experiment": (BASE, SECTIONS, ["run", "--explain", "{path}"]),
    "synth": (SPEC, ("arrivals", "lengths", "lengths.prompt", "prefix", "requests", "extra"),
              ["trace", "synth", "{path}"]),
    "profile": (PROFILE, ("coefficients", "coefficients.step", "fit", "block_sizes", "kv_capacity_blocks", "extra"),
                ["simulate", "--trace", "t.jsonl", "--model", "smollm2-135m", "--cost", "calibrated",
                 "--profile", "{path}"]),
}


def _child() -> None:
    import copy

    import yaml
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    failures: list[dict] = []
    counter = [0]

    def anchor_name() -> str:
        counter[0] += 1
        return f"a{counter[0]}"

    scalars = st.one_of(
        st.none(), st.booleans(), st.integers(-10**6, 10**6), st.integers(min_value=10**15, max_value=10**40),
        st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
        st.sampled_from(["1e6", "1.0e+6", "2024-13-45", "2024-01-01", "0x1F", "~", "yes", "'quoted'", "1" * 5000,
                         "!!python/object:os.system", "!!binary AAAA", "&", "*", "<<", "{", "]"]))

    @st.composite
    def flow(draw, depth: int, anchors: list[str]) -> str:
        """A flow-style YAML value: scalars, lists, mappings, some anchored, some aliases to earlier anchors."""
        kind = draw(st.sampled_from(["scalar", "scalar", "list", "map", "alias"] if depth < 4 else ["scalar"]))
        if kind == "alias" and anchors:
            return "*" + draw(st.sampled_from(anchors))
        if kind in ("scalar", "alias"):
            value = draw(scalars)
            return value if isinstance(value, str) and draw(st.booleans()) else yaml.safe_dump(
                value, default_flow_style=True, width=10**9).removesuffix("\n...\n").strip()
        items = [draw(flow(depth + 1, anchors)) for _ in range(draw(st.integers(0, 4)))]
        if kind == "list":
            text = "[" + ", ".join(items) + "]"
        else:
            keys = draw(st.lists(st.sampled_from(["rate", "cv", "process", "dist", "min", "max", "requests",
                                                  "window", "sample", "<<", "k", "k"]), min_size=len(items),
                                 max_size=len(items)))
            text = "{" + ", ".join(f"{k}: {v}" for k, v in zip(keys, items, strict=True)) + "}"
        if draw(st.integers(0, 3)) == 0:
            name = anchor_name()
            recursive = draw(st.integers(0, 5)) == 0  # an alias to the value being defined
            anchors.append(name)
            return f"&{name} " + (text[:-1] + (", " if items else "") + f"*{name}" + text[-1] if recursive else text)
        return text

    @st.composite
    def bomb(draw) -> str:
        """Billion laughs: each level lists the one before `width` times; `depth` levels expand to width^depth."""
        width, depth = draw(st.integers(2, 12)), draw(st.integers(3, 12))
        merge = draw(st.booleans())  # mappings merged with `<<`, or sequences
        levels = []
        for i in range(depth):
            if i == 0:
                levels.append(f"l0: &l0 {{{', '.join(f'k{j}: lol' for j in range(width))}}}" if merge else
                              f"l0: &l0 [{', '.join(['lol'] * width)}]")
            elif merge:
                levels.append(f"l{i}: &l{i} {{{', '.join(f'k{j}: *l{i - 1}' for j in range(width))}}}")
            else:
                levels.append(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]")
        return "{" + ", ".join(levels) + "}"

    def place(doc: dict, path: str, payload: str) -> str:
        """The document as YAML with `payload` (YAML text) as the value at `path`."""
        doc = copy.deepcopy(doc)
        node = doc
        parts = path.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {}) if isinstance(node.get(part), dict | None) else {}
        node[parts[-1]] = "__PAYLOAD__"
        return yaml.safe_dump(doc, sort_keys=False).replace("__PAYLOAD__", payload.replace("\n", " "))

    Path("t.jsonl").write_text('{"timestamp": 0, "input_length": 5, "output_length": 3}\n')

    def run(text: str | bytes, entry: str = "experiment") -> None:
        path = Path(f"{entry}.yaml")
        path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass"))
        argv = [arg.format(path=path) for arg in ENTRIES[entry][2]]
        bounded_child.check(text if isinstance(text, str) else repr(text[:2000]), argv, failures)

    entries = st.sampled_from(["experiment", "experiment", "synth", "profile"])

    @st.composite
    def placed(draw, payloads: st.SearchStrategy) -> tuple[str, str]:
        """(entry point, its document with a payload at one of its sections)."""
        entry = draw(entries)
        base, sections, _ = ENTRIES[entry]
        return entry, place(base, draw(st.sampled_from(sections)), draw(payloads))

    options = settings(max_examples=30, deadline=None, derandomize=True, database=None,
                       suppress_health_check=list(HealthCheck))

    @st.composite
    def aliased(draw) -> str:
        anchors: list[str] = []
        payload = draw(flow(0, anchors))
        if anchors and draw(st.booleans()):  # an alias to it elsewhere in the document
            payload = f"{{first: {payload}, again: *{draw(st.sampled_from(anchors))}}}"
        return payload

    @options
    @given(placed(aliased()))
    def valid_ish(case: tuple[str, str]) -> None:
        run(case[1], case[0])

    @options
    @given(placed(bomb()))
    def bombs(case: tuple[str, str]) -> None:
        run(case[1], case[0])

    @settings(max_examples=25, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
    @given(st.data())
    def damaged(data: st.DataObject) -> None:
        entry = data.draw(entries)
        text = yaml.safe_dump(ENTRIES[entry][0], sort_keys=False)
        how = data.draw(st.sampled_from(["truncate", "binary", "deep", "duplicate", "tag", "bytes", "merge",
                                         "documents"]))
        if how == "truncate":
            text = text[:data.draw(st.integers(0, len(text)))]
        elif how == "binary":
            text = text.encode() + data.draw(st.binary(min_size=1, max_size=64))  # type: ignore[assignment]
        elif how == "deep":
            depth = data.draw(st.integers(50, 5000))
            text += "extra: " + "[" * depth + "]" * depth + "\n"
        elif how == "duplicate":
            text += "name: again\n"
        elif how == "tag":
            text += "extra: !!python/object/apply:os.system ['true']\n"
        elif how == "bytes":
            text = data.draw(st.binary(max_size=200))  # type: ignore[assignment]
        elif how == "documents":
            text += "---\n" + text
        else:
            text = "base: &b {requests: 5}\n<<: *b\n" + text
        run(text, entry)

    @settings(max_examples=15, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
    @given(st.one_of(flow(0, []), bomb()))
    def retime(payload: str) -> None:
        bounded_child.check(payload, ["trace", "convert", "t.jsonl", "out.jsonl", "--retime", payload], failures)

    for suite in (valid_ish, bombs, damaged, retime):
        suite()
    bounded_child.report(failures)


def test_experiment_yaml_fuzz_never_crashes_hangs_or_runs_out_of_memory(tmp_path):
    bounded_child.check_suite(Path(__file__), SUITE_TIMEOUT_S, tmp_path, minimum=80)  # every strategy ran


if __name__ == "__main__" and "--child" in sys.argv:
    _child()
