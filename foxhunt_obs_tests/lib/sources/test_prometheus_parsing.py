import json
import math

import numpy as np
import pytest

from foxhunt_obs.lib.sources.prometheus import MatrixParser, RangeResult, parse_matrix, split_windows


def _body(result, result_type="matrix"):
    # Prometheus writes compact JSON; so does json.dumps with these separators.
    return json.dumps(
        {"status": "success", "data": {"resultType": result_type, "result": result}}, separators=(",", ":")
    ).encode()


def test_parse_matches_json_loads_including_nan_and_inf():
    result = [
        {
            "metric": {"__name__": "DCGM_FI_DEV_GPU_UTIL", "gpu": "0", "UUID": "GPU-a"},
            "values": [[1700000000, "87"], [1700000015, "NaN"], [1700000030.5, "+Inf"], [1700000045, "-Inf"]],
        },
        {"metric": {"gpu": "1", "weird": 'a},"values":[[x'}, "values": [[1700000000, "1e-3"]]},
    ]
    r = parse_matrix(_body(result))
    assert r.labels == [s["metric"] for s in result]
    assert r.offsets.tolist() == [0, 4, 5]
    assert r.ts.tolist() == [1700000000, 1700000015, 1700000030.5, 1700000045, 1700000000]
    assert r.values[0] == 87 and math.isnan(r.values[1])
    assert r.values[2] == math.inf and r.values[3] == -math.inf and r.values[4] == 0.001
    assert r.series_of_point().tolist() == [0, 0, 0, 0, 1]


def test_parse_empty_and_missing_labels():
    assert parse_matrix(_body([])).labels == []
    r = parse_matrix(_body([{"metric": {}, "values": [[1, "2"]]}]))
    assert r.labels == [{}] and r.values.tolist() == [2.0]


def test_parse_rejects_errors_and_vectors():
    with pytest.raises(ValueError, match="not a successful"):
        parse_matrix(b'{"status":"error","errorType":"bad_data","error":"parse error"}')
    with pytest.raises(ValueError, match="not a matrix"):
        parse_matrix(_body([{"metric": {}, "value": [1, "2"]}], "vector"))


def test_concat_merges_chunks_of_the_same_series_in_time_order():
    a = parse_matrix(
        _body(
            [
                {"metric": {"g": "0"}, "values": [[0, "1"], [15, "2"]]},
                {"metric": {"g": "1"}, "values": [[0, "5"]]},
            ]
        )
    )
    b = parse_matrix(
        _body([{"metric": {"g": "1"}, "values": [[30, "6"]]}, {"metric": {"g": "0"}, "values": [[30, "3"]]}])
    )
    r = RangeResult.concat([a, RangeResult.empty(), b])
    assert r.labels == [{"g": "0"}, {"g": "1"}]
    assert r.offsets.tolist() == [0, 3, 5]
    assert r.ts.tolist() == [0, 15, 30, 0, 30] and r.values.tolist() == [1, 2, 3, 5, 6]


@pytest.mark.parametrize(
    ("start", "end", "step", "max_points", "expected"),
    [
        (0, 3600, 15, 11000, [(0, 3585)]),  # half-open: the point at `end` belongs to the next window
        (0, 3600, 15, 100, [(0, 1485), (1500, 2985), (3000, 3585)]),
        (0, 3600, 15, 240, [(0, 3585)]),
        (0, 3600, 15, 239, [(0, 3570), (3585, 3585)]),
        (0, 10, 15, 5, [(0, 0)]),  # a range shorter than a step still has its first point
        (100, 100, 15, 5, []),
    ],
)
def test_split_windows(start, end, step, max_points, expected):
    assert split_windows(start, end, step, max_points) == expected


def test_split_windows_covers_the_grid_exactly_once():
    start, end, step = 1_700_000_000, 1_700_000_000 + 86400 * 3, 15
    grid = np.arange(start, end, step)
    got = np.concatenate([np.arange(s, e + step, step) for s, e in split_windows(start, end, step, 11000)])
    assert np.array_equal(got, grid)
    assert all((e - s) / step + 1 <= 11000 for s, e in split_windows(start, end, step, 11000))


@pytest.mark.parametrize("chunk", [1, 7, 64, 1000])
def test_incremental_parse_equals_whole_parse_at_any_chunk_boundary(chunk):
    result = [
        {
            "metric": {"__name__": "x", "gpu": str(g)},
            "values": [[1700000000 + 15 * k, str(k * g)] for k in range(50)],
        }
        for g in range(5)
    ]
    body = _body(result)
    parser = MatrixParser()
    for i in range(0, len(body), chunk):
        parser.feed(body[i : i + chunk])
    got, whole = parser.finish(), parse_matrix(body)
    assert got.labels == whole.labels == [s["metric"] for s in result]
    assert np.array_equal(got.offsets, whole.offsets)
    assert np.array_equal(got.ts, whole.ts) and np.array_equal(got.values, whole.values)


def test_labels_named_like_the_answers_keys_do_not_cut_a_series():
    """A series ends where the next `{"metric":` begins: a label called `metric` or `values`, or a value
    holding those words, brackets or quotes, is inside a JSON string or object and moves no boundary."""
    result = [
        {"metric": {"metric": "a", "values": "[[1,\"2\"]]"}, "values": [[1, "1"], [2, "2"]]},
        {"metric": {"__name__": "x", "q": '{"metric":{}},"values":[[9,"9"]]},'}, "values": [[3, "3"]]},
        {"metric": {}, "values": [[4, "NaN"], [5, "5"], [6, "6"]]},
    ]
    body = _body(result)
    for chunk in (1, 5, 11, len(body)):
        parser = MatrixParser()
        for i in range(0, len(body), chunk):
            parser.feed(body[i : i + chunk])
        r = parser.finish()
        assert r.labels == [s["metric"] for s in result]
        assert r.offsets.tolist() == [0, 2, 3, 6]
        assert r.ts.tolist() == [1, 2, 3, 4, 5, 6]
        assert r.values[:3].tolist() == [1, 2, 3] and math.isnan(r.values[3]) and r.values[4:].tolist() == [5, 6]


@pytest.mark.parametrize(
    "values",
    [b'[1,"2",3]', b'[1,"2"],[3]', b'[1,"x"]', b'[1,"2"],[2,"3",]', b'[1,"2"]]],[[3,"4"]'],
)
def test_malformed_values_are_an_error(values):
    for last in (False, True):  # the last series is cut out at the end, the others at the next one's start
        series = [b'{"metric":{"g":"0"},"values":' + b"[" + values + b"]}"]
        other = b'{"metric":{"g":"1"},"values":[[1,"1"]]}'
        items = [*series, other] if not last else [other, *series]
        body = b'{"status":"success","data":{"resultType":"matrix","result":[' + b",".join(items) + b"]}}"
        with pytest.raises(ValueError):
            parse_matrix(body)


def test_a_truncated_answer_is_an_error():
    body = _body([{"metric": {"g": "0"}, "values": [[1, "2"], [2, "3"]]}])
    with pytest.raises(ValueError, match="truncated"):
        parse_matrix(body[: len(body) // 2 + 20])


def test_an_answer_cut_between_two_series_is_an_error():
    """Well-formed up to the cut (once 480 rows instead of 960 were written as complete)."""
    body = _body([{"metric": {"g": str(g)}, "values": [[1, "2"], [2, "3"]]} for g in range(2)])
    cut = body.index(b',{"metric":{"g":"1"}')
    for end in (cut, cut + 1, len(body) - 1, len(body) - 2):
        with pytest.raises(ValueError, match="truncated"):
            parse_matrix(body[:end])
    assert len(parse_matrix(body).labels) == 2
    with pytest.raises(ValueError, match="truncated"):
        parse_matrix(_body([])[:-1])


def test_warnings_and_infos_after_the_data_are_a_complete_answer():
    doc = {
        "status": "success",
        "data": {"resultType": "matrix", "result": [{"metric": {"g": "0"}, "values": [[1, "2"]]}]},
    }
    for extra in ({"warnings": ["PromQL warning: x ]]} y"]}, {"infos": ["info"], "warnings": []}):
        r = parse_matrix(json.dumps({**doc, **extra}, separators=(",", ":")).encode())
        assert r.values.tolist() == [2.0]


@pytest.mark.parametrize(
    "error, hint",
    [
        ("query processing would load too many samples into memory", "too many samples or a timeout"),
        ("open querier for block 01M8: open index reader: block is closing", "Prometheus is shutting down"),
    ],
)
def test_a_422_says_what_it_means(error, hint):
    import requests

    from foxhunt_obs.lib.sources.prometheus import http_error_text

    r = requests.Response()
    r.status_code = 422
    r._content = json.dumps({"status": "error", "errorType": "execution", "error": error}).encode()
    text = http_error_text(r)
    assert text.startswith(f"HTTP 422 execution: {error}") and f"({hint}" in text
