"""`kvplan simulate`: JSON output, tables on disk, and bad input named with what is allowed."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from kvplan import traces
from kvplan.cli import main
from kvplan.sim.parallel import run_parallel
from kvplan.sim.run import simulate
from kvplan.sim.spec import SimSpec
from kvplan.traces import Trace

SAMPLE = "traces/samples/mooncake_style.jsonl"


def _trace_file(tmp_path, rows: list[str]):
    path = tmp_path / "t.jsonl"
    path.write_text("".join(r + "\n" for r in rows))
    return str(path)


def test_json_summary_and_tables(tmp_path, capsys):
    trace = _trace_file(tmp_path, ['{"timestamp": 0, "input_length": 40, "output_length": 5, "hash_ids": [1]}',
                                   '{"timestamp": 100, "input_length": 600, "output_length": 9, "hash_ids": [1, 2]}'])
    out = tmp_path / "out"
    args = ["simulate", "--trace", trace, "--block-size", "16", "--json", "--out", str(out), "--format", "csv"]
    assert main(args) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["summary"]["completed"] == 2 and doc["block_size"] == 16
    table = pd.read_csv(out / "requests.csv")
    assert table["output_tokens"].tolist() == [5, 9]
    assert (out / "series.csv").is_file() and json.loads((out / "summary.json").read_text())["summary"]


def test_every_answer_states_its_model_error(tmp_path, capsys, monkeypatch):
    """--json carries the `model_error` block of the source that priced the GPU (strict JSON); the terminal
    answer says it in one line."""
    from pathlib import Path

    from kvplan.sim.gpu import model_error

    monkeypatch.setattr(model_error, "MODEL_ERROR_FILE", Path(__file__).parent / "data" / "model_error.json")
    trace = _trace_file(tmp_path, ['{"timestamp": 0, "input_length": 40, "output_length": 5}'])
    assert main(["simulate", "--trace", trace, "--hardware", "l4", "--json"]) == 0
    block = json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(c))["model_error"]
    assert (block["source"], block["hardware"], block["step_band_pct"]) == ("analytic, transferred", "l4",
                                                                            [-12.0, 15.0])
    assert [f["family"] for f in block["families"]] == ["gemm", "elementwise"]
    assert main(["simulate", "--trace", trace, "--hardware", "a100-40gb", "--block-size", "16", "32"]) == 0
    printed = capsys.readouterr().out
    assert "model error (analytic, transferred, a100-40gb): step time error -12.0% to +15.0%" in printed


def test_a_gpu_profile_prices_its_gpu_from_the_measured_table(tmp_path, capsys, monkeypatch):
    """--gpu-profile DIR (a Vidur-format directory): the measured table prices the GPU it was measured on, the
    answer names that source, and a directory of other GPUs is refused in one line."""
    from pathlib import Path

    from kvplan.sim.gpu import model_error

    data = Path(__file__).parent / "data"
    monkeypatch.setattr(model_error, "MODEL_ERROR_FILE", data / "model_error.json")
    trace = _trace_file(tmp_path, ['{"timestamp": 0, "input_length": 300, "output_length": 20}'])
    base = ["simulate", "--trace", trace, "--hardware", "a100-40gb", "--num-blocks", "400", "--json"]
    assert main(base) == 0
    analytic = json.loads(capsys.readouterr().out)
    assert main([*base, "--gpu-profile", str(data / "vidur_profiles")]) == 0
    measured = json.loads(capsys.readouterr().out)
    assert (measured["model_error"]["source"], measured["model_error"]["step_band_pct"]) == ("measured table",
                                                                                             [-4.0, 6.0])
    assert analytic["model_error"]["source"] == "analytic, transferred"
    assert measured["summary"]["mean_ttft_ms"] != analytic["summary"]["mean_ttft_ms"]  # the table priced it
    assert main(["simulate", "--trace", trace, "--hardware", "h100-sxm", "--gpu-profile",
                 str(data / "vidur_profiles")]) == 2
    assert "none of them for h100-sxm" in capsys.readouterr().err
    assert main(["simulate", "--trace", trace, "--hardware", "cpu-local", "--model", "smollm2-135m",
                 "--gpu-profile", str(data / "vidur_profiles")]) == 2
    assert "--gpu-profile" in capsys.readouterr().err  # never ignored: the calibrated cost reads no per-op profile


def test_parquet_tables_per_block_size(tmp_path, capsys):
    out = tmp_path / "cmp"
    assert main(["simulate", "--trace", SAMPLE, "--block-size", "128", "256", "--num-blocks", "4000",
                 "--out", str(out), "--json"]) == 0
    runs = json.loads(capsys.readouterr().out)["runs"]
    assert [r["block_size"] for r in runs] == [128, 256]
    # The sample, like the Mooncake trace, has requests beyond llama-3-8b's 8,192-token context: rejected, counted.
    sample = traces.load(SAMPLE)
    over = int(np.count_nonzero(sample.prompt_tokens + sample.output_tokens > 8192))
    assert over > 0
    for run in runs:
        assert run["summary"]["num_rejected"] == run["info"]["rejected_over_length"] == over
        assert run["info"]["max_model_len"] == 8192
    for block in (128, 256):
        table = pd.read_parquet(out / f"block{block}" / "requests.parquet")
        # every request has its row; the rejected ones with their reason and no latencies
        served = table[table["rejected"] == ""]
        assert len(table) == 400 and len(served) == 400 - over and (served["ttft_ms"] > 0).all()
        assert table.loc[table["rejected"] != "", "ttft_ms"].isna().all()
        assert len(pd.read_parquet(out / f"block{block}" / "series.parquet")) > 0


def test_block_size_comparison_table(capsys):
    assert main(["simulate", "--trace", SAMPLE, "--block-size", "64", "256", "--num-blocks", "4000"]) == 0
    text = capsys.readouterr().out
    assert "kv_blocks" in text and "\n   64" in text and "\n  256" in text


@pytest.mark.parametrize("flags,message", [
    (["--router", "nearest"], "--router: unknown router 'nearest'; allowed: round_robin, least_outstanding"),
    (["--eviction", "random"], "argument --eviction: unknown value 'random'; allowed: fifo, lfu, lru, s3fifo"),
    (["--preemption-mode", "kill"], "argument --preemption-mode: unknown value 'kill'; allowed: recompute, swap"),
    (["--hardware", "tpu-v5"], "--hardware: unknown hardware 'tpu-v5'; allowed: a100-40gb"),
    (["--model", "gpt-9"], "--model: unknown model 'gpt-9'; did you mean 'gpt-oss-20b'? allowed: a built-in model ("),
    (["--num-blocks", "100"], "cannot hold one request of the trace"),
    (["--block-size", "48"], "--block-size: 48 neither divides nor is a multiple of the trace's prefix-hash "
                             "granularity 512"),
    (["--model", "llama-3-70b", "--hardware", "l4"], "no memory left for the KV cache"),
])
def test_bad_input_says_what_is_allowed(flags, message, capsys):
    assert main(["simulate", "--trace", SAMPLE, *flags]) == 2
    assert message in capsys.readouterr().err


def test_empty_and_unsorted_traces_are_reported():
    with pytest.raises(ValueError, match="has no requests"):
        simulate(Trace.build([], [], []), SimSpec())
    with pytest.raises(ValueError, match="not sorted by arrival_s \\(row 2 arrives before row 1\\)"):
        simulate(Trace.build(np.array([0.0, 2.0, 1.0]), [5, 5, 5], [2, 2, 2]), SimSpec())


def test_a_reservation_of_every_slot_runs_to_the_end(capsys):
    """Used to end in "unfinished requests but nothing could be scheduled": the watermark came on top of a
    reservation as large as the whole cache (max_model_len 8192 = 512 blocks of 16: every request reserves it all)."""
    assert main(["simulate", "--trace", SAMPLE, "--allocator", "max", "--clip-context", "--num-blocks", "512",
                 "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["summary"]["completed"] == 400 and doc["info"]["rejected"] == 0


def test_sink_window_peak_is_checked_against_every_chunk(capsys):
    """Used to preempt one request hundreds of times and end in a RuntimeError: each later chunk needs the sinks,
    the window and a whole budget-sized chunk, which 300 blocks cannot hold."""
    flags = ["simulate", "--trace", SAMPLE, "--clip-context", "--num-blocks", "300", "--block-size", "16",
             "--sink-tokens", "4",
             "--window-tokens", "4096", "--no-prefix-caching", "--max-num-batched-tokens", "2048"]
    assert main(flags) == 2
    assert "needs 386 KV blocks at its peak" in capsys.readouterr().err
    assert main([*flags, "--max-num-batched-tokens", "512", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["summary"]["completed"] == 400


def test_workers_split_replicas_with_the_same_result(tmp_path, capsys, monkeypatch):
    import kvplan.sim.run as sim_run

    monkeypatch.setattr("kvplan.sim.parallel.MIN_PARALLEL_REQUESTS", 100)  # the sample is short
    splits = []
    monkeypatch.setattr(sim_run, "run_parallel", lambda *a, **k: splits.append(a) or run_parallel(*a, **k))
    docs = []
    for workers in ("1", "2"):
        assert main(["simulate", "--trace", SAMPLE, "--replicas", "3", "--num-blocks", "3000", "--workers", workers,
                     "--json"]) == 0
        docs.append(json.loads(capsys.readouterr().out))
    docs[0]["info"].pop("wall_s"), docs[1]["info"].pop("wall_s")
    assert docs[0] == docs[1] and len(splits) == 1  # --workers 2 ran the replicas in processes


def test_workers_that_cannot_split_say_why(capsys):
    assert main(["simulate", "--trace", SAMPLE, "--replicas", "2", "--router", "least_outstanding",
                 "--num-blocks", "3000", "--workers", "2", "--json"]) == 0
    err = capsys.readouterr().err
    assert "--workers 2: ran in one process: the least_outstanding router reads the replicas' state" in err
