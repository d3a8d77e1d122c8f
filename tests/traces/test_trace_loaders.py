"""Every loader on a fixture in its published layout, format detection, and bad-row handling."""

from __future__ import annotations

import numpy as np
import pytest

from kvplan import traces
from tests.traces.trace_fixtures import (
    AZURE_2023,
    AZURE_2024,
    BURSTGPT,
    BURSTGPT_V3,
    LENGTHS,
    MOONCAKE,
    QWEN,
    VIDUR,
    jsonl_text,
    write_jsonl,
    write_text,
)
from kvplan.traces import TraceFormatError


def test_azure_2023_seven_fractional_digits(tmp_path):
    t = traces.load(write_text(tmp_path, "conv.csv", AZURE_2023))
    assert t.report.format == "azure"
    np.testing.assert_allclose(t.arrival_s, [0.0, 4.314579, 4.31941], atol=1e-9)
    assert t.prompt_tokens.tolist() == [374, 396, 879]
    assert t.output_tokens.tolist() == [44, 109, 28]
    assert not t.has_prefix


def test_azure_2024_iso_with_zone_and_missing_fraction(tmp_path):
    t = traces.load(write_text(tmp_path, "code_1week.csv", AZURE_2024))
    np.testing.assert_allclose(t.arrival_s, [0.0, 0.00993, 2.5])
    assert t.prompt_tokens.tolist() == [2048, 1200, 77]


def test_mooncake_hashes_and_milliseconds(tmp_path):
    t = traces.load(write_jsonl(tmp_path, "conversation_trace.jsonl", MOONCAKE))
    assert t.report.format == "mooncake" and t.hash_granularity == 512
    assert t.arrival_s.tolist() == [0.0, 0.0, 3.0]
    assert t.hashes_of(1).tolist() == [0, 14, 15]
    assert t.hash_offsets.tolist() == [0, 14, 17, 31]
    record = list(t.records())[2]
    assert record.prefix_hashes == (*range(12), 2353, 2354) and record.hash_granularity == 512


def test_qwen_bailian_sessions_follow_parent_chain(tmp_path):
    t = traces.load(write_jsonl(tmp_path, "qwen_traceA_blksz_16.jsonl", QWEN))
    assert t.report.format == "qwen-bailian" and t.hash_granularity == 16
    assert t.request_id.tolist() == [159, 160, 201, 305]
    assert t.session_id.tolist() == [159, 160, 159, 159]
    assert t.turn.tolist() == [1, 1, 2, 3]
    np.testing.assert_allclose(t.arrival_s, [0.0, 0.086, 29.386, 58.886])
    assert len(t.hashes_of(2)) == 44


def test_burstgpt_drops_failed_requests_and_reports(tmp_path):
    t = traces.load(write_text(tmp_path, "BurstGPT_1.csv", BURSTGPT))
    assert t.report.format == "burstgpt"
    assert t.prompt_tokens.tolist() == [472, 417]
    assert t.report.dropped_failed == 1
    assert "dropped 1 failed requests" in " ".join(t.report.lines())
    kept = traces.load(tmp_path / "BurstGPT_1.csv", keep_failed=True)
    assert kept.output_tokens.tolist() == [18, 0, 217] and kept.report.dropped_failed == 0


def test_burstgpt_release3_sessions(tmp_path):
    t = traces.load(write_text(tmp_path, "BurstGPT_v3.csv", BURSTGPT_V3))
    assert t.session_id.tolist() == [17, -1]
    assert t.arrival_s.tolist() == [0.0, 2.5]
    assert [r.session_id for r in t.records()] == [17, None]


def test_burstgpt_session_labels_that_are_not_numbers(tmp_path):
    text = BURSTGPT_V3.replace(",17,", ",a9f3,").replace("3.0,,", "3.0,b1,")
    t = traces.load(write_text(tmp_path, "BurstGPT_v3.csv", text), keep_failed=True)
    assert t.session_id.tolist() == [0, 0, 1]
    t = traces.load(write_text(tmp_path, "BurstGPT_v3.csv", BURSTGPT_V3.replace("0.5,17,", "0.5,,")))
    assert t.session_id.tolist() == [-1, -1]


def test_vidur_and_length_only(tmp_path):
    t = traces.load(write_text(tmp_path, "splitwise.csv", VIDUR))
    assert t.report.format == "vidur" and t.timed
    assert t.arrival_s.tolist() == [0.0, 0.25, 1.5]
    lengths = traces.load(write_text(tmp_path, "sharegpt_stats.csv", LENGTHS))
    assert lengths.report.format == "lengths" and not lengths.timed
    assert lengths.prompt_tokens.tolist() == [74, 290]
    assert lengths.arrival_s.tolist() == [0.0, 0.0]


def test_named_format_overrides_detection(tmp_path):
    path = write_text(tmp_path, "splitwise.csv", VIDUR)
    assert traces.load(path, format="lengths").report.format == "lengths"
    with pytest.raises(TraceFormatError, match="unknown trace format 'nope'; allowed: azure"):
        traces.load(path, format="nope")


def test_undetectable_content_names_the_allowed_layouts(tmp_path):
    path = write_text(tmp_path, "x.csv", "a,b\n1,2\n")
    with pytest.raises(TraceFormatError, match=r"x.csv:1: cannot tell the trace format.*azure: TIMESTAMP"):
        traces.load(path)


def test_missing_column_is_reported_at_the_header(tmp_path):
    path = write_text(tmp_path, "t.csv", "arrived_at,num_prefill_tokens\n0,1\n")
    with pytest.raises(TraceFormatError, match=r"t.csv:1: missing column 'num_decode_tokens'"):
        traces.load(path, format="vidur")


def _bad_row(text: str, line: int, replacement: str) -> str:
    lines = text.splitlines(keepends=True)
    lines[line - 1] = replacement + "\n"
    return "".join(lines)


MALFORMED = [
    ("azure", AZURE_2023, 3, "2023-11-16 18:15:50.9951690,abc,109", "non-numeric ContextTokens 'abc'"),
    ("azure", AZURE_2024, 2, "yesterday,2048,13", "bad TIMESTAMP 'yesterday'"),
    ("burstgpt", BURSTGPT, 4, "118,GPT-4,-3,217,634,API log", "Request tokens -3 is out of range"),
    ("vidur", VIDUR, 3, "0.25,2048", "missing value for column 'num_decode_tokens'"),
    ("lengths", LENGTHS, 2, "74,9.5,992,0.08", "num_decode_tokens '9.5' is not an integer"),
    ("vidur", VIDUR, 4, "1.5,300,300,7", "more fields than the header's 3"),
    ("mooncake", jsonl_text(MOONCAKE), 2, '{"timestamp": 0, "input_length": 10, "hash_ids": [1]}',
     "missing value for column 'output_length'"),
    ("mooncake", jsonl_text(MOONCAKE), 3, '{"timestamp": 3000, "input_length": 10, "output_length": 1, '
     '"hash_ids": [1, 2.5]}', "hash_ids must be a list of integers, got [1, 2.5]"),
    ("mooncake", jsonl_text(MOONCAKE), 3, '{"timestamp": 3000, "input_length": 10, "output_length": 1, '
     '"hash_ids": [1, -4]}', "hash_ids must hold integers >= 0"),
    ("mooncake", jsonl_text(MOONCAKE), 2, '{"timestamp": 0, "input_length": 10,', "invalid JSON"),
    ("qwen-bailian", jsonl_text(QWEN), 4, '{"chat_id": 305, "parent_chat_id": 201, "timestamp": 1.0, '
     '"input_length": 800, "output_length": 10, "type": "text", "turn": 3, "hash_ids": []}',
     "timestamp goes backwards by 89.5 s; allowed: at most 1 s"),
]


@pytest.mark.parametrize(("fmt", "text", "line", "replacement", "problem"), MALFORMED)
def test_malformed_row_names_file_and_line(tmp_path, fmt, text, line, replacement, problem):
    path = write_text(tmp_path, "bad.txt", _bad_row(text, line, replacement))
    with pytest.raises(TraceFormatError) as err:
        traces.load(path, format=fmt)
    assert str(err.value).startswith(f"{path}:{line}: ")
    assert problem in str(err.value)
    skipped = traces.load(path, format=fmt, skip_bad=True)
    assert skipped.report.dropped_bad == 1 and skipped.report.bad_lines == [line]
    assert f"dropped 1 bad rows (--skip-bad), first at lines {line}" in skipped.report.lines()


def test_out_of_order_within_tolerance_is_sorted_and_counted(tmp_path):
    text = "arrived_at,num_prefill_tokens,num_decode_tokens\n1.0,10,1\n0.5,20,2\n2.0,30,3\n"
    t = traces.load(write_text(tmp_path, "v.csv", text))
    assert t.prompt_tokens.tolist() == [20, 10, 30]
    assert t.arrival_s.tolist() == [0.0, 0.5, 1.5]
    assert t.request_id.tolist() == [1, 0, 2]
    assert t.report.reordered == 1
    with pytest.raises(TraceFormatError, match=r"v.csv:3: timestamp goes backwards by 0.5 s"):
        traces.load(tmp_path / "v.csv", order_tolerance_s=0.1)


def test_blank_lines_are_not_rows_and_keep_line_numbers(tmp_path):
    path = write_text(tmp_path, "v.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n0,1,1\n\n1,x,1\n")
    with pytest.raises(TraceFormatError, match=r"v.csv:4: non-numeric num_prefill_tokens 'x'"):
        traces.load(path)


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such trace file"):
        traces.load(tmp_path / "absent.csv")
