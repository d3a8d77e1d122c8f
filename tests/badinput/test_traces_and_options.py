"""The bad-input corpus for trace files (every loader format) and command-line options: each case runs the CLI
in-process and must exit 2 with one line on stderr that names the file and line (or the option) and what is
allowed, and no traceback. The silently-wrong inputs the issue found are cases here: each is now an error."""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kvplan import traces
from kvplan.cli import main

SAMPLE = str(Path(__file__).resolve().parents[2] / "traces" / "samples" / "chat.jsonl")

AZURE = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
AZURE_MM = "TIMESTAMP,NumImages,ContextTokens,GeneratedTokens\n"
BURST = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
VIDUR = "arrived_at,num_prefill_tokens,num_decode_tokens\n"
SPLIT = "request_id,request_type,application_id,arrival_timestamp,batch_size,prompt_size,token_size\n"
LENGTHS = "num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio\n"
NATIVE = "request_id,arrival_s,prompt_tokens,output_tokens,session_id,turn,priority,n,hash_granularity,prefix_hashes\n"


def _jsonl(*rows: dict) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def _moon(**changes) -> dict:
    return {"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [1], **changes}


def _qwen(chat_id: int, timestamp: float = 0.0, **changes) -> dict:
    return {"chat_id": chat_id, "parent_chat_id": -1, "timestamp": timestamp, "input_length": 20, "output_length": 3,
            "type": "text", "turn": 1, "hash_ids": [1, 2], **changes}


def _native(rid: int, t: float = 0.0, **changes) -> dict:
    return {"request_id": rid, "arrival_s": t, "prompt_tokens": 20, "output_tokens": 3, **changes}


def _bench(rid: str = "bench-0", **changes) -> dict:
    return {"request_id": rid, "input_toks": 20, "output_toks": 3, "arrival_time": 1.7e9, "queued_ts": 10.0,
            "scheduled_ts": 10.0, "first_token_ts": 10.1, "last_token_ts": 10.2, **changes}


def _parquet(frame: pd.DataFrame) -> bytes:
    buffer = io.BytesIO()
    frame.to_parquet(buffer, index=False)
    return buffer.getvalue()


NATIVE_FRAME = dict(request_id=[0, 1], arrival_s=[0.0, 1.0], prompt_tokens=[10, 20], output_tokens=[2, 3],
                    priority=[0, 0], n=[1, 1], hash_granularity=[0, 0])

# (id, file name, content, extra CLI arguments, expected fragment: "{f}" is the file's path)
CASES = [
    # -- numbers: beyond int64, beyond float64's exact integers, NaN, booleans, absurd magnitudes ---------------
    ("azure-1e30-prompt", "a.csv", AZURE + "2023-11-16 18:15:46.68,1e30,44\n2023-11-16 18:15:47.0,100,44\n", [],
     "{f}:2: ContextTokens 1e30 is out of range; allowed: at most 10000000"),
    ("azure-bad-timestamp", "a.csv", AZURE + "yesterday,100,44\n", [], "{f}:2: bad TIMESTAMP 'yesterday'"),
    ("azure-mm-negative-images", "m.csv", AZURE_MM + "2024-10-15T12:00:00.269Z,-1,770,491\n", [],
     "{f}:2: NumImages -1 is out of range; allowed: an integer >= 0"),
    ("azure-mm-fractional-images", "m.csv", AZURE_MM + "2024-10-15T12:00:00.269Z,1.5,770,491\n", [],
     "{f}:2: NumImages '1.5' is not an integer"),
    ("mooncake-bool-length", "m.jsonl", _jsonl(_moon(input_length=True)), [],
     "{f}:1: input_length True is a boolean; allowed: numbers"),
    ("mooncake-bool-hashes", "m.jsonl", _jsonl(_moon(), _moon(hash_ids=[True, False])), [],
     "{f}:2: hash_ids [True, False] holds a boolean"),
    ("mooncake-huge-timestamp", "m.jsonl", _jsonl(_moon(), _moon(timestamp=1e30)), [],
     "{f}:2: timestamp 1e+30 is out of range; allowed: at most 10000000000000 (float64 seconds"),
    ("mooncake-hash-beyond-int64", "m.jsonl", _jsonl(_moon(hash_ids=[2**64])), [],
     "{f}:1: hash_ids must be a list of integers"),
    ("qwen-ids-beyond-2^53", "q.jsonl", _jsonl(_qwen(2**53), _qwen(2**53 + 1, 1.0)), [],
     "{f}:1: chat_id 9007199254740992 is out of range; allowed: at most 9007199254740991 (ids are exact"),
    ("qwen-duplicate-chat-id", "q.jsonl", _jsonl(_qwen(7), _qwen(7, 1.0)), [],
     "{f}:2: request_id 7 repeats the id of line 1; allowed: unique ids"),
    ("qwen-parent-below-minus-one", "q.jsonl", _jsonl(_qwen(7, parent_chat_id=-5)), [],
     "{f}:1: parent_chat_id -5 is out of range; allowed: an integer >= -1"),
    ("burstgpt-nan-timestamp", "b.csv", BURST + "nan,ChatGPT,10,5,15,Conversation log\n", [],
     "{f}:2: non-numeric Timestamp 'nan'; allowed: a number"),
    ("burstgpt-empty-prompt", "b.csv", BURST + "5,ChatGPT,0,5,5,Conversation log\n", [],
     "{f}:2: Request tokens 0 is out of range; allowed: an integer >= 1 (0 only for a failed request"),
    ("vidur-arrival-1e27", "v.csv", VIDUR + "0,10,2\n1e27,10,3\n", [],
     "{f}:3: arrived_at 1e27 is out of range; allowed: at most 10000000000"),
    ("vidur-inf-arrival", "v.csv", VIDUR + "inf,10,2\n", [], "{f}:2: non-numeric arrived_at 'inf'"),
    ("splitwise-batched", "s.csv", SPLIT + "0,2,0,1,4,4096,32\n", [], "{f}:2: batch_size 4 is not supported"),
    ("splitwise-duplicate-id", "s.csv", SPLIT + "3,2,0,1,1,4096,32\n3,2,0,2,1,10,3\n", [],
     "{f}:3: request_id 3 repeats the id of line 2"),
    ("lengths-fractional", "l.csv", LENGTHS + "74,9.5,992,0.08\n", [], "{f}:2: num_decode_tokens '9.5' is not an"),
    ("lengths-1e30", "l.csv", LENGTHS + "1e30,9,992,0.08\n", [], "{f}:2: num_prefill_tokens 1e30 is out of range"),
    ("vllm-bench-stamps-out-of-order", "r.jsonl", _jsonl(_bench(), _bench("bench-1", last_token_ts=10.05)), [],
     "{f}:2: last_token_ts 10.050000 is before first_token_ts 10.100000; allowed: queued_ts <= scheduled_ts"),
    ("vllm-bench-duplicate-id", "r.jsonl", _jsonl(_bench(), _bench(arrival_time=1.7e9 + 1)), [],
     "{f}:2: request_id 0 repeats the id of line 1; allowed: unique ids"),
    ("native-jsonl-duplicate-id", "n.jsonl", _jsonl(_native(4), _native(4, 1.0)), [],
     "{f}:2: request_id 4 repeats the id of line 1"),
    ("native-jsonl-zero-n", "n.jsonl", _jsonl(_native(4, n=0)), [], "{f}:1: n 0 is out of range; allowed: an"),
    ("native-jsonl-hashes-no-granularity", "n.jsonl", _jsonl(_native(4, prefix_hashes=[1])), [],
     "{f}:1: prefix_hashes given but hash_granularity is missing or 0"),
    ("native-jsonl-granularity-zero", "n.jsonl", _jsonl(_native(4, prefix_hashes=[1], hash_granularity=0)), [],
     "{f}:1: prefix_hashes given but hash_granularity is missing or 0"),
    ("native-jsonl-more-hashes-than-blocks", "n.jsonl",
     _jsonl(_native(4, prefix_hashes=[1, 2, 3], hash_granularity=16)), [],
     "{f}:1: 3 prefix_hashes for 20 prompt tokens; at 16 tokens per hash allowed: at most ceil(20/16) = 2"),
    ("native-csv-line-after-quoted-newline", "n.csv",
     NATIVE + '0,0,20,2,,,0,1,16,"1\n2"\n1,1,20,2,,,0,1,16,3\n2,2,x,2,,,0,1,16,\n', [],
     "{f}:5: non-numeric prompt_tokens 'x'"),
    ("native-csv-priority-word", "n.csv", NATIVE + "0,0,20,2,,,high,1,0,\n", [],
     "{f}:2: non-numeric priority 'high'"),
    ("native-parquet-duplicate-id", "n.parquet",
     _parquet(pd.DataFrame({**NATIVE_FRAME, "request_id": [5, 5]})), [], "{f}:2: request_id 5 repeats the id of line"),
    ("native-parquet-bool-column", "n.parquet",
     _parquet(pd.DataFrame({**NATIVE_FRAME, "prompt_tokens": [True, False]})), [],
     "{f}: column 'prompt_tokens' holds booleans; allowed: numbers"),
    # -- messages that used to mislead ------------------------------------------------------------------------------
    ("not-utf8-names-the-line", "v.csv", (VIDUR + "0,10,2\n").encode() + b"1,1\xff0,2\n", [],
     "{f}:3: not UTF-8 text (byte b'\\xff' at column 4); allowed: UTF-8 text (--skip-bad drops such rows)"),
    ("not-utf8-jsonl", "m.jsonl", _jsonl(_moon()).encode() + b'{"timestamp": 1, "input_length": 1\xe9}\n', [],
     "{f}:2: not UTF-8 text"),
    ("early-outlier-is-blamed", "v.csv", VIDUR + "0,10,2\n1000000,10,2\n2,10,2\n3,10,2\n4,10,2\n", [],
     "{f}:3: timestamp jumps 999998 s ahead of the rows after it; allowed: at most 1 s"),
    ("late-row-is-blamed", "v.csv", VIDUR + "0,10,2\n50,10,2\n60,10,2\n5,10,2\n70,10,2\n", [],
     "{f}:5: timestamp goes backwards by 55 s"),
    ("headerless", "v.csv", "0,10,2\n1,10,2\n", [], "{f}:1: the first line '0,10,2' is data, not a header"),
    ("qwen-without-type-is-ambiguous", "q.jsonl",
     _jsonl(*({k: v for k, v in _qwen(i, float(i)).items() if k != "type"} for i in range(2))), [],
     "{f}:1: ambiguous trace format: its fields look like qwen-bailian but lack 'type'"),
    # -- bounded parsing: limits hold while the content streams in (limits.MAX_TRACE_*) -------------------------
    ("gzip-endless-line", "v.csv", gzip.compress(VIDUR.encode()) + gzip.compress(b"1" * 2**20, mtime=0) * 80, [],
     "{f}:2: line longer than 67108864 bytes (gzip-decompressed); allowed: rows of at most 67108864 bytes"),
    ("jsonl-nested-past-the-stack", "m.jsonl", _jsonl(_moon()) + '{"x": ' + "[" * 10**5 + "]" * 10**5 + "}\n", [],
     "{f}:2: nested too deeply; allowed: one JSON object per line"),
    # -- options of the trace commands -------------------------------------------------------------------------
    ("order-tolerance-nan", "v.csv", VIDUR + "0,10,2\n", ["--order-tolerance", "nan"],
     "argument --order-tolerance: nan; allowed: a finite number >= 0"),
    ("order-tolerance-negative", "v.csv", VIDUR + "0,10,2\n", ["--order-tolerance", "-1"],
     "argument --order-tolerance: -1; allowed: a finite number >= 0"),
    ("hash-granularity-zero", "v.csv", VIDUR + "0,10,2\n", ["--hash-granularity", "0"],
     "argument --hash-granularity: 0; allowed: an integer >= 1"),
    ("format-unknown", "v.csv", VIDUR + "0,10,2\n", ["--format", "nope"], "argument --format: invalid choice: 'nope'"),
]


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _one_clear_line(code: int, err: str, fragment: str) -> None:
    assert code == 2, err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    assert fragment in err, err


@pytest.mark.parametrize(("name", "content", "extra", "fragment"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_trace_files(tmp_path, capsys, name, content, extra, fragment):
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    code, _, err = _run(["trace", "stats", str(path), *extra], capsys)
    _one_clear_line(code, err, fragment.format(f=path))


def test_every_loader_format_has_two_cases():
    counted = {name: 0 for name in traces.FORMATS}
    for _, filename, _, extra, _ in CASES:
        if extra:
            continue
        path = Path("/nonexistent") / filename
        fmt = {"a.csv": "azure", "m.csv": "azure-multimodal", "m.jsonl": "mooncake", "q.jsonl": "qwen-bailian",
               "b.csv": "burstgpt", "v.csv": "vidur", "s.csv": "splitwise", "l.csv": "lengths",
               "r.jsonl": "vllm-bench", "n.jsonl": "kvplan-jsonl", "n.csv": "kvplan-csv",
               "n.parquet": "kvplan-parquet"}[path.name]
        counted[fmt] += 1
    assert all(n >= 2 for n in counted.values()), counted


def test_skip_bad_drops_the_rows_it_names(tmp_path, capsys):
    """--skip-bad drops exactly the rows an error would name: the early outlier (not the good rows after it),
    the non-UTF-8 row, and the row after a quoted newline by its own line number."""
    outlier = tmp_path / "v.csv"
    outlier.write_text(VIDUR + "0,10,2\n1000000,10,2\n2,10,2\n3,10,2\n4,10,2\n")
    t = traces.load(outlier, skip_bad=True)
    assert t.report.bad_lines == [3] and t.arrival_s.tolist() == [0.0, 2.0, 3.0, 4.0]
    undecodable = tmp_path / "u.csv"
    undecodable.write_bytes((VIDUR + "0,10,2\n").encode() + b"1,1\xff0,2\n2,10,2\n")
    t = traces.load(undecodable, skip_bad=True)
    assert t.report.bad_lines == [3] and t.prompt_tokens.tolist() == [10, 10]
    code, _, err = _run(["trace", "stats", str(undecodable), "--skip-bad"], capsys)
    assert code == 0 and "dropped 1 bad rows (--skip-bad), first at lines 3" in err + _run(
        ["trace", "stats", str(undecodable), "--skip-bad"], capsys)[1]
    quoted = tmp_path / "n.csv"
    quoted.write_text(NATIVE + '0,0,20,2,,,0,1,16,"1\n2"\n1,1,20,2,,,0,1,16,3\n2,2,x,2,,,0,1,16,\n')
    t = traces.load(quoted, skip_bad=True)
    assert t.report.bad_lines == [5] and t.hashes_of(0).tolist() == [1, 2]


def test_a_jsonl_file_with_a_byte_order_mark_loads_like_a_csv_one(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + _jsonl(_moon(), _moon(timestamp=1000)).encode())
    assert traces.load(path).arrival_s.tolist() == [0.0, 1.0]


# -- command-line options ------------------------------------------------------------------------------------------
SIMULATE_OPTIONS = [
    (["--gpu-memory-utilization", "1.5"], "argument --gpu-memory-utilization: must be a finite number > 0 and"
                                          " <= 1"),
    (["--gpu-memory-utilization", "nan"], "argument --gpu-memory-utilization: must be a finite number > 0 and"
                                          " <= 1, got nan"),
    (["--block-size", "0"], "argument --block-size: must be an integer >= 1 and <= 256, got 0"),
    (["--block-size", "-16"], "argument --block-size: must be an integer >= 1 and <= 256, got -16"),
    (["--num-blocks", "0"], "argument --num-blocks: must be an integer >= 1 and <= 50000000"),
    (["--num-blocks", "1e12"], "argument --num-blocks: must be an integer >= 1"),
    (["--num-blocks", "100000000000"], "must be an integer >= 1 and <= 50000000 (one object per KV block"),
    (["--trace-format", "kvplan-parquet"], "format kvplan-parquet reads PARQUET, but this file is JSONL"),
    (["--cpu-blocks", "100000000000"], "argument --cpu-blocks: must be an integer >= 0 and <= 50000000 (one"
                                                " object per KV block: more would exhaust memory), got 100000000000"),
    (["--replicas", "1000000"], "argument --replicas: 1000000; allowed: an integer >= 1 and <= 10000"),
    (["--replicas", "2000", "--num-blocks", "40000"], "--num-blocks: 2000 replicas x (40000 + 0 CPU) = 80000000 KV"
                                                      " blocks; allowed: at most 50000000"),
    (["--sample-interval", "1e-9"], "--sample-interval: 1e-09 s over a"),
    (["--sample-interval", "inf"], "argument --sample-interval: inf; allowed: a finite number > 0"),
    (["--max-model-len", "16384"], "--max-model-len: 16384 exceeds llama-3-8b's context length 8192"),
    (["--sink-tokens", "8", "--window-tokens", "4"], "cache.sink_tokens: 8 exceeds cache.window_tokens 4"),
    (["--rate", "nan"], "argument --rate: nan; allowed: a finite number > 0"),
    (["--retime", "{process: poisson, rate: [1"], "--retime: not YAML"),
    (["--retime", "!!python/object/apply:os.system ['true']"], "--retime: not YAML"),
    (["--out", ""], "argument --out: empty path"),
    (["--trace-format", "azure"], "chat.jsonl: format azure reads CSV, but this file is JSONL"),
]


@pytest.mark.parametrize(("flags", "fragment"), SIMULATE_OPTIONS, ids=[" ".join(f) for f, _ in SIMULATE_OPTIONS])
def test_bad_simulate_options(capsys, flags, fragment):
    code, _, err = _run(["simulate", "--trace", SAMPLE, *flags], capsys)
    _one_clear_line(code, err, fragment)


TRANSFORM_OPTIONS = [
    (["--jitter", "inf"], "argument --jitter: inf; allowed: a finite number > 0"),
    (["--jitter", "0"], "argument --jitter: 0; allowed: a finite number > 0"),
    (["--sample", "0"], "argument --sample: 0; allowed: a finite number > 0 and <= 1"),
    (["--sample", "1.5"], "argument --sample: 1.5"),
    (["--rate-scale", "-2"], "argument --rate-scale: -2"),
    (["--expand-block", "0"], "argument --expand-block: 0; allowed: an integer >= 1 and <= 256"),
    (["--clip-context", "1"], "argument --clip-context: 1; allowed: an integer >= 2"),
]


@pytest.mark.parametrize(("flags", "fragment"), TRANSFORM_OPTIONS, ids=[" ".join(f) for f, _ in TRANSFORM_OPTIONS])
def test_bad_transform_options(tmp_path, capsys, flags, fragment):
    code, _, err = _run(["trace", "convert", SAMPLE, str(tmp_path / "o.jsonl"), *flags], capsys)
    _one_clear_line(code, err, fragment)
    assert not (tmp_path / "o.jsonl").exists()


@pytest.mark.parametrize(("argv", "fragment"), [
    (["trace", "convert", SAMPLE, "{tmp}"], "out: {tmp} is a directory; allowed: a regular file path"),
    (["trace", "convert", SAMPLE, "{tmp}/file.jsonl/x.jsonl"], "file.jsonl is not a directory; allowed: a path"),
    (["trace", "synth", "traces/samples/chat.yaml", "-o", "{tmp}"], "--out: {tmp} is a directory"),
    (["trace", "convert", SAMPLE, "{tmp}/t.txt"], "cannot tell the output format from the extension"),
])
def test_bad_output_paths_fail_before_any_work(tmp_path, capsys, argv, fragment):
    (tmp_path / "file.jsonl").write_text("")
    argv = [a.format(tmp=tmp_path) for a in argv]
    code, _, err = _run(argv, capsys)
    _one_clear_line(code, err, fragment.format(tmp=tmp_path))


def test_json_is_strict_when_a_metric_is_undefined(tmp_path, capsys):
    """Every output one token long: TPOT and ITL have no samples. --json says null, never a bare NaN."""
    path = tmp_path / "one.jsonl"
    path.write_text(_jsonl(*(_native(i, float(i), output_tokens=1) for i in range(3))))
    code, out, _ = _run(["simulate", "--trace", str(path), "--json"], capsys)
    assert code == 0

    def refuse(token: str) -> None:
        raise AssertionError(f"non-strict JSON constant {token}")

    doc = json.loads(out, parse_constant=refuse)
    assert doc["summary"]["mean_tpot_ms"] is None and doc["summary"]["completed"] == 3


def test_ctrl_c_and_a_bug_each_say_what_they_are(capsys, monkeypatch):
    from kvplan import sim
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(sim.run, "simulate", interrupted)
    code, _, err = _run(["simulate", "--trace", SAMPLE], capsys)
    assert code == 130 and err.strip() == "kvplan simulate: interrupted"

    def broken(*args, **kwargs):
        raise RuntimeError("an invariant broke")

    monkeypatch.setattr(sim.run, "simulate", broken)
    code, _, err = _run(["simulate", "--trace", SAMPLE], capsys)
    assert code == 1 and "Traceback" in err and "RuntimeError: an invariant broke" in err
    assert err.strip().splitlines()[-1].startswith("kvplan simulate: internal error (a bug in kvplan")


def test_numbers_that_are_fine_still_load(tmp_path):
    """The bounds reject the absurd, not the large: a 2-million-token prompt, ids up to 2^53 - 1, Unix-epoch
    arrivals in milliseconds."""
    path = tmp_path / "ok.jsonl"
    path.write_text(_jsonl(_native(2**53 - 1, 1.7e9, prompt_tokens=2_000_000), _native(0, 1.7e9 + 1)))
    t = traces.load(path)
    assert t.request_id.tolist() == [2**53 - 1, 0] and t.prompt_tokens.max() == 2_000_000
    np.testing.assert_allclose(t.arrival_s, [0.0, 1.0])
