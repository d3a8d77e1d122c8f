"""Traces as published, and what users trip over with them: BurstGPT's failed requests, compressed files, a
CSV without a header, hash ids at another granularity, ambiguous layouts, and the layouts added for
splitwise-sim, Azure 2025 multimodal, BurstGPT without `Log Type` and Mooncake without `hash_ids`."""

from __future__ import annotations

import bz2
import contextlib
import gzip
import io
import json
import lzma
from pathlib import Path

import numpy as np
import pytest
import zstandard

from kvplan import traces
from kvplan.cli import main
from tests.traces.trace_fixtures import (
    AZURE_2023,
    AZURE_2025,
    BURSTGPT_FAILED,
    BURSTGPT_NO_LOG_TYPE,
    LENGTHS,
    MOONCAKE,
    MOONCAKE_16,
    MOONCAKE_NO_HASHES,
    QWEN,
    SPLITWISE,
    jsonl_text,
    write_jsonl,
    write_text,
)
from kvplan.traces import TraceFormatError
from kvplan.traces.io import render

COMPRESSORS = {
    "gzip": gzip.compress,
    "bz2": bz2.compress,
    "xz": lzma.compress,
    "zstd": lambda data: zstandard.ZstdCompressor().compress(data),
}


def _cli(argv: list[str], capsys) -> tuple[int, str, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _same_trace(a: traces.Trace, b: traces.Trace) -> None:
    assert list(a.records()) == list(b.records())
    assert (a.hash_granularity, a.timed, a.report.format) == (b.hash_granularity, b.timed, b.report.format)


# -- BurstGPT's failed requests ---------------------------------------------------------------------------------
def test_burstgpt_failed_rows_with_zero_request_tokens_are_counted_not_lost(tmp_path):
    path = write_text(tmp_path, "BurstGPT_1.csv", BURSTGPT_FAILED)
    t = traces.load(path)
    assert t.prompt_tokens.tolist() == [472, 417]
    assert t.report.dropped_failed == 3 and t.report.dropped_bad == 0
    assert "dropped 3 failed requests" in " ".join(t.report.lines())


def test_keep_failed_keeps_every_failed_row(tmp_path):
    path = write_text(tmp_path, "BurstGPT_1.csv", BURSTGPT_FAILED)
    t = traces.load(path, keep_failed=True)
    assert t.prompt_tokens.tolist() == [472, 0, 1087, 417, 0]
    assert t.output_tokens.tolist() == [18, 0, 0, 217, 0]
    assert t.report.kept_failed == 3 and t.report.dropped_failed == 0
    assert "kept 3 failed requests" in " ".join(t.report.lines())


def test_zero_request_tokens_is_bad_only_in_a_request_that_did_not_fail(tmp_path):
    path = write_text(tmp_path, "b.csv", BURSTGPT_FAILED.replace("118,GPT-4,417,217", "118,GPT-4,0,217"))
    with pytest.raises(TraceFormatError, match=r"b.csv:5: Request tokens 0 is out of range; allowed: an integer >= 1 "
                                               r"\(0 only for a failed request"):
        traces.load(path)


def test_kept_failed_requests_are_rejected_and_counted_by_the_simulator(tmp_path, capsys):
    path = write_text(tmp_path, "BurstGPT_1.csv", BURSTGPT_FAILED)
    code, out, err = _cli(["simulate", "--trace", str(path), "--keep-failed", "--json"], capsys)
    assert code == 0
    doc = json.loads(out)
    assert doc["summary"]["completed"] == 2 and doc["summary"]["num_rejected"] == 3
    assert doc["info"]["rejected_failed"] == 3
    assert "3 of 5 requests rejected" in err and "3 failed requests of the trace" in err


def test_kept_failed_trace_round_trips_through_convert(tmp_path, capsys):
    path = write_text(tmp_path, "BurstGPT_1.csv", BURSTGPT_FAILED)
    original = traces.load(path, keep_failed=True)
    for kind in ("jsonl", "csv", "parquet"):
        out = tmp_path / f"kept.{kind}"
        code, _, _ = _cli(["trace", "convert", str(path), str(out), "--keep-failed", "--json"], capsys)
        assert code == 0
        assert list(traces.load(out).records()) == list(original.records())


# -- compressed files -----------------------------------------------------------------------------------------
PLAIN = {
    "azure.csv": AZURE_2023,
    "mooncake.jsonl": jsonl_text(MOONCAKE),
    "qwen.jsonl": jsonl_text(QWEN),
    "lengths.csv": LENGTHS,
}


@pytest.mark.parametrize("method", sorted(COMPRESSORS))
@pytest.mark.parametrize("name", sorted(PLAIN))
def test_every_compressed_form_gives_the_plain_files_trace(tmp_path, method, name):
    plain = write_text(tmp_path, name, PLAIN[name])
    data = COMPRESSORS[method](plain.read_bytes())
    suffixed = tmp_path / f"{name}.{method}"
    unsuffixed = tmp_path / "trace"  # detection reads the content, not the file name
    for path in (suffixed, unsuffixed):
        path.write_bytes(data)
        loaded = traces.load(path)
        _same_trace(loaded, traces.load(plain))
        assert loaded.report.source == str(path)


@pytest.mark.parametrize("method", sorted(COMPRESSORS))
def test_compressed_parquet_and_our_csv(tmp_path, method):
    trace = traces.load(write_jsonl(tmp_path, "m.jsonl", MOONCAKE))
    for kind in ("parquet", "csv"):
        path = tmp_path / f"t.{kind}.{method}"
        path.write_bytes(COMPRESSORS[method](render(trace, kind)))
        again = traces.load(path)
        assert list(again.records()) == list(trace.records()) and again.report.format == f"kvplan-{kind}"


def test_compressed_errors_keep_their_line_numbers(tmp_path):
    text = AZURE_2023.replace("396,109", "abc,109")
    path = tmp_path / "conv.csv.gz"
    path.write_bytes(gzip.compress(text.encode()))
    with pytest.raises(TraceFormatError, match=r"conv.csv.gz:3: non-numeric ContextTokens 'abc'"):
        traces.load(path)
    assert traces.load(path, skip_bad=True).report.bad_lines == [3]


def test_truncated_archive_and_binary_garbage_are_one_line_errors(tmp_path, capsys):
    truncated = tmp_path / "t.csv.gz"
    truncated.write_bytes(gzip.compress(AZURE_2023.encode() * 50)[:-30])
    code, _, err = _cli(["trace", "stats", str(truncated)], capsys)
    assert code == 2 and "corrupt or truncated gzip data" in err and "Traceback" not in err
    garbage = tmp_path / "t.csv"
    garbage.write_bytes(b"\x8b\x00\xff\xfeTIMESTAMP\n\xff\xff,1,2\n")
    code, _, err = _cli(["trace", "stats", str(garbage)], capsys)
    assert code == 2 and f"{garbage}:1: not UTF-8 text" in err and len(err.strip().splitlines()) == 1


# -- a CSV without a header ------------------------------------------------------------------------------------
def test_headerless_csv_names_the_file_and_the_expected_headers(tmp_path, capsys):
    headerless = "".join(AZURE_2023.splitlines(keepends=True)[1:])
    path = write_text(tmp_path, "conv.csv", headerless)
    code, _, err = _cli(["trace", "stats", str(path)], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert f"{path}:1: the first line '2023-11-16 18:15:46.6805900,374,44' is data, not a header" in err
    assert "azure: TIMESTAMP,ContextTokens,GeneratedTokens" in err
    with pytest.raises(TraceFormatError, match=r"allowed: the vidur header arrived_at,num_prefill_tokens,"
                                               r"num_decode_tokens"):
        traces.load(write_text(tmp_path, "v.csv", "0.0,100,20\n0.25,2048,7\n"), format="vidur")


def test_repeated_header_names_are_named(tmp_path):
    path = write_text(tmp_path, "d.csv", "arrived_at,num_prefill_tokens,num_prefill_tokens\n0,1,1\n")
    with pytest.raises(TraceFormatError, match=r"d.csv:1: the header names column 'num_prefill_tokens' twice"):
        traces.load(path)


# -- prefix-hash granularity -----------------------------------------------------------------------------------
def test_mooncake_hash_counts_are_checked_and_a_granularity_suggested(tmp_path, capsys):
    path = write_jsonl(tmp_path, "m16.jsonl", MOONCAKE_16)
    code, _, err = _cli(["trace", "stats", str(path)], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert (f"{path}:1: 7 hash_ids for 100 prompt tokens; at 512 tokens per hash allowed: exactly "
            "ceil(100/512) = 1; this file's counts fit 16-token hashes (--hash-granularity 16)") in err
    t = traces.load(path, hash_granularity=16)
    assert t.hash_granularity == 16 and t.hashes_of(1).tolist() == [0, 1, 7]
    code, out, _ = _cli(["trace", "stats", str(path), "--hash-granularity", "16", "--json"], capsys)
    assert code == 0 and json.loads(out)["prefix"]["hash_granularity"] == 16


def test_more_hashes_than_blocks_is_refused_in_every_hashed_format(tmp_path):
    qwen = [dict(QWEN[0], hash_ids=list(range(40)))]  # 521 tokens hold ceil(521/16) = 33 blocks
    with pytest.raises(TraceFormatError, match=r"40 hash_ids for 521 prompt tokens; at 16 tokens per hash allowed: "
                                               r"at most ceil\(521/16\) = 33"):
        traces.load(write_jsonl(tmp_path, "q.jsonl", qwen))
    native = [{"request_id": 0, "arrival_s": 0.0, "prompt_tokens": 20, "output_tokens": 3, "hash_granularity": 16,
               "prefix_hashes": [1, 2, 3]}]
    with pytest.raises(TraceFormatError, match=r"3 prefix_hashes for 20 prompt tokens"):
        traces.load(write_jsonl(tmp_path, "n.jsonl", native))


def test_hashes_without_a_granularity_are_not_dropped_silently(tmp_path):
    native = [{"request_id": 0, "arrival_s": 0.0, "prompt_tokens": 20, "output_tokens": 3, "prefix_hashes": [1]}]
    with pytest.raises(TraceFormatError, match=r"n.jsonl:1: prefix_hashes given but hash_granularity is missing"):
        traces.load(write_jsonl(tmp_path, "n.jsonl", native))


# -- detection -----------------------------------------------------------------------------------------------
def test_qwen_without_type_is_ambiguous_not_mooncake(tmp_path):
    rows = [{k: v for k, v in r.items() if k != "type"} for r in QWEN]
    path = write_jsonl(tmp_path, "q.jsonl", rows)
    with pytest.raises(TraceFormatError, match=r"q.jsonl:1: ambiguous trace format: its fields look like "
                                               r"qwen-bailian but lack 'type'; as mooncake its 'chat_id', "
                                               r"'parent_chat_id', 'turn' would be ignored"):
        traces.load(path)
    # Mooncake's rows carry exactly ceil(prompt / G) hashes, at an overridden G too: Qwen's prefix-only lists
    # do not, so reading them as Mooncake is refused rather than silently re-meant
    with pytest.raises(TraceFormatError, match=r"34 hash_ids for 800 prompt tokens; at 16 tokens per hash allowed: "
                                               r"exactly ceil\(800/16\) = 50"):
        traces.load(path, format="mooncake", hash_granularity=16)


def test_the_published_files_detect_as_before(tmp_path):
    assert traces.load(write_jsonl(tmp_path, "m.jsonl", MOONCAKE)).report.format == "mooncake"
    assert traces.load(write_jsonl(tmp_path, "q.jsonl", QWEN)).report.format == "qwen-bailian"
    assert traces.load(write_text(tmp_path, "l.csv", LENGTHS)).report.format == "lengths"


# -- the added layouts -------------------------------------------------------------------------------------------
def test_burstgpt_without_log_type(tmp_path):
    t = traces.load(write_text(tmp_path, "excerpt.csv", BURSTGPT_NO_LOG_TYPE))
    assert t.report.format == "burstgpt" and t.prompt_tokens.tolist() == [472, 417]
    assert t.arrival_s.tolist() == [0.0, 113.0]


def test_burstgpt_missing_column_lists_required_and_optional(tmp_path):
    path = write_text(tmp_path, "b.csv", "Timestamp,Model,Request tokens\n5,ChatGPT,10\n")
    with pytest.raises(TraceFormatError) as err:
        traces.load(path, format="burstgpt")
    assert ("missing column 'Response tokens'; found Timestamp, Model, Request tokens; allowed: Timestamp,"
            "Request tokens,Response tokens,Model (optional: Session ID,Total tokens,Log Type,Elapsed time)") in str(
        err.value)


def test_mooncake_without_hash_ids(tmp_path):
    t = traces.load(write_jsonl(tmp_path, "synthetic.jsonl", MOONCAKE_NO_HASHES))
    assert t.report.format == "mooncake" and not t.has_prefix
    assert t.prompt_tokens.tolist() == [6758, 1030, 6955] and t.arrival_s.tolist() == [0.0, 0.0, 3.0]


def test_splitwise_request_csv(tmp_path):
    t = traces.load(write_text(tmp_path, "test_trace.csv", SPLITWISE))
    assert t.report.format == "splitwise"
    assert t.request_id.tolist() == [0, 1, 2] and t.arrival_s.tolist() == [0.0, 2.0, 3.5]
    assert t.prompt_tokens.tolist() == [4096, 2048, 2048] and t.output_tokens.tolist() == [32, 8, 16]
    batched = SPLITWISE.replace("0,2,0,1,1,4096,32", "0,2,0,1,4,4096,32")
    with pytest.raises(TraceFormatError, match=r"s.csv:2: batch_size 4 is not supported; allowed: 1"):
        traces.load(write_text(tmp_path, "s.csv", batched))
    repeated = SPLITWISE.replace("2,2,0,4.5", "1,2,0,4.5")
    with pytest.raises(TraceFormatError, match=r"r.csv:4: request_id 1 repeats the id of line 3"):
        traces.load(write_text(tmp_path, "r.csv", repeated))


def test_azure_2025_multimodal_gzipped(tmp_path):
    path = tmp_path / "AzureLMMInferenceTrace_multimodal.csv.gz"
    path.write_bytes(gzip.compress(AZURE_2025.encode()))
    t = traces.load(path)
    assert t.report.format == "azure-multimodal"
    np.testing.assert_allclose(t.arrival_s, [0.0, 5.55, 5.731], atol=1e-9)
    assert t.prompt_tokens.tolist() == [770, 949, 964] and t.output_tokens.tolist() == [491, 126, 79]
    assert "NumImages is not modelled: 2 requests carry 4 images" in " ".join(t.report.lines())


NEW_LAYOUTS = {
    "burstgpt-no-log-type.csv": BURSTGPT_NO_LOG_TYPE,
    "splitwise.csv": SPLITWISE,
    "azure-2025.csv": AZURE_2025,
    "mooncake-no-hashes.jsonl": jsonl_text(MOONCAKE_NO_HASHES),
}


@pytest.mark.parametrize("name", sorted(NEW_LAYOUTS))
@pytest.mark.parametrize("kind", ["jsonl", "csv", "parquet"])
def test_each_new_layout_round_trips_through_convert(tmp_path, capsys, name, kind):
    source = write_text(tmp_path, name, NEW_LAYOUTS[name])
    out = tmp_path / f"converted.{kind}"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["trace", "convert", str(source), str(out)]) == 0
    again, original = traces.load(out), traces.load(source)
    assert list(again.records()) == list(original.records())
    assert again.report.format == f"kvplan-{kind}"


# -- context limits and length-only traces in `simulate` --------------------------------------------------------
def _long_trace(tmp_path: Path) -> Path:
    rows = [{"request_id": i, "arrival_s": float(i), "prompt_tokens": p, "output_tokens": 50}
            for i, p in enumerate([1000, 9000, 3000, 8150, 20000])]
    return write_jsonl(tmp_path, "long.jsonl", rows)


def test_requests_beyond_the_models_context_are_rejected_and_counted(tmp_path, capsys):
    path = _long_trace(tmp_path)  # llama-3-8b: 8,192 tokens; 9000+50, 8150+50 and 20000+50 exceed it
    code, out, err = _cli(["simulate", "--trace", str(path), "--json"], capsys)
    assert code == 0
    doc = json.loads(out)
    assert doc["summary"]["completed"] == 2 and doc["summary"]["num_rejected"] == 3
    assert doc["info"]["max_model_len"] == 8192 and doc["info"]["rejected_over_length"] == 3
    assert "3 of 5 requests rejected, never served" in err and "longer than max_model_len 8192" in err
    assert any("3 of 5 requests rejected" in n for n in doc["notes"])


def test_clip_context_serves_them_clipped(tmp_path, capsys):
    path = _long_trace(tmp_path)
    code, out, err = _cli(["simulate", "--trace", str(path), "--clip-context", "--json"], capsys)
    assert code == 0 and json.loads(out)["summary"]["completed"] == 5 and "clipped 3 requests" in err
    code, out, _ = _cli(["simulate", "--trace", str(path), "--clip-context", "4096", "--json"], capsys)
    assert code == 0 and json.loads(out)["info"]["max_model_len"] == 4096


def test_max_model_len_is_bounded_by_the_context(tmp_path, capsys):
    path = _long_trace(tmp_path)
    code, _, err = _cli(["simulate", "--trace", str(path), "--max-model-len", "16384"], capsys)
    assert code == 2 and "--max-model-len: 16384 exceeds llama-3-8b's context length 8192; allowed: at most 8192" in err
    code, out, _ = _cli(["simulate", "--trace", str(path), "--model", "qwen2.5-7b", "--json"], capsys)
    assert code == 0 and json.loads(out)["summary"]["completed"] == 5  # a 32k context holds them all


def test_length_only_simulate_says_so_and_rate_gives_arrivals(tmp_path, capsys):
    path = write_text(tmp_path, "sharegpt_stats.csv", LENGTHS)
    code, _, err = _cli(["simulate", "--trace", str(path), "--json"], capsys)
    assert code == 0 and "has no arrival times (a length-only trace): all 2 requests arrive at t = 0" in err
    assert "--rate R" in err
    code, _out, err = _cli(["simulate", "--trace", str(path), "--rate", "0.01", "--out", str(tmp_path / "o"),
                           "--json"], capsys)
    assert code == 0 and "no arrival times" not in err and "re-timed with poisson arrivals" in err
    import pandas as pd

    arrivals = pd.read_parquet(tmp_path / "o" / "requests.parquet")["arrival_s"].tolist()
    assert arrivals[0] == 0.0 and arrivals[1] > 0  # 100 s apart on average: not one burst
    code, _, err = _cli(["simulate", "--trace", str(path), "--rate", "1", "--retime", "{process: poisson, rate: 1}"],
                        capsys)
    assert code == 2 and "--rate and --retime both give arrival times" in err


def test_simulate_has_the_loaders_options(tmp_path, capsys):
    text = AZURE_2023.replace("396,109", "abc,109")
    path = write_text(tmp_path, "conv.csv", text)
    code, _, err = _cli(["simulate", "--trace", str(path)], capsys)
    assert code == 2 and "conv.csv:3: non-numeric ContextTokens 'abc'" in err
    code, out, err = _cli(["simulate", "--trace", str(path), "--skip-bad", "--json"], capsys)
    assert code == 0 and json.loads(out)["summary"]["completed"] == 2
    assert "dropped 1 bad rows (--skip-bad), first at lines 3" in err


# -- output files follow the umask ------------------------------------------------------------------------------
@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_written_files_and_result_directories_follow_the_umask(tmp_path, umask):
    import os

    from kvplan.output import atomic_dir, write_atomic

    old = os.umask(umask)
    try:
        write_atomic(tmp_path / "a" / "t.jsonl", "x\n")
        with atomic_dir(tmp_path / "set") as tmp:
            write_atomic(tmp / "summary.json", "{}")
    finally:
        os.umask(old)
    assert (tmp_path / "a" / "t.jsonl").stat().st_mode & 0o777 == 0o666 & ~umask
    assert (tmp_path / "set").stat().st_mode & 0o777 == 0o777 & ~umask
    assert (tmp_path / "set" / "summary.json").stat().st_mode & 0o777 == 0o666 & ~umask
