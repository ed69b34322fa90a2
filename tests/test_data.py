"""Tests for pipelines.data (streaming data pack / FlashRAG readers)."""

import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.data import (
    BadRowError,
    DataPackError,
    Passage,
    QAExample,
    count_records,
    iter_corpus,
    iter_mirage,
    iter_qa,
    iter_records,
    pack_file,
    resolve_data_dir,
    split_contents,
)


def write_jsonl(path, rows, gz=False):
    lines = "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)
    if gz:
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(lines)
    else:
        path.write_text(lines, encoding="utf-8")
    return path


# ---------------------------------------------------------------- real pack


def test_real_corpus_head(data_dir):
    ps = list(iter_corpus(data_dir / "corpus.jsonl.gz", limit=5))
    assert len(ps) == 5 and all(isinstance(p, Passage) for p in ps)
    assert ps[0].id == "wiki-000000" and ps[0].title and ps[0].text
    assert ps[0].contents == f'"{ps[0].title}"\n{ps[0].text}'


def test_real_qa_head(data_dir):
    qs = list(iter_qa(pack_file("train.jsonl.gz", data_dir), limit=20, split="train"))
    assert len(qs) == 20
    for q in qs:
        assert q.question and q.golden_answers and all(isinstance(a, str) for a in q.golden_answers)
        assert q.split == "train" and q.dataset and ":" in q.id
        assert {"type", "support", "origin", "orig_split"} <= q.meta.keys()
        assert "source" not in q.meta


def test_real_dev_count(data_dir):
    assert count_records(data_dir / "dev.jsonl.gz") == 735


def test_real_mirage_head(data_dir):
    rows = list(iter_mirage(pack_file("mirage.jsonl.gz"), limit=3))
    assert len(rows) == 3 and all(r["answer"] in r["options"] for r in rows)


def test_resolve_from_env(data_dir, monkeypatch):
    monkeypatch.setenv("SEARCHRL_DATA", str(data_dir))
    assert resolve_data_dir() == data_dir
    assert resolve_data_dir(str(data_dir)) == data_dir


# ---------------------------------------------------------------- resolve errors


def test_missing_env_var(monkeypatch):
    monkeypatch.delenv("SEARCHRL_DATA", raising=False)
    with pytest.raises(DataPackError) as e:
        resolve_data_dir()
    msg = str(e.value)
    assert "SEARCHRL_DATA is not set" in msg
    assert "export SEARCHRL_DATA=../shared/data" in msg and "corpus.jsonl.gz" in msg


def test_env_not_a_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("SEARCHRL_DATA", str(tmp_path / "nope"))
    with pytest.raises(DataPackError, match="is not a directory.*export SEARCHRL_DATA"):
        resolve_data_dir()


def test_dir_without_corpus(tmp_path):
    with pytest.raises(DataPackError, match="has no corpus.jsonl.gz"):
        resolve_data_dir(tmp_path)


def test_pack_file_missing(tmp_path):
    write_jsonl(tmp_path / "corpus.jsonl.gz", [{"id": "a", "title": "t", "text": "x"}], gz=True)
    assert pack_file("corpus.jsonl.gz", tmp_path) == tmp_path / "corpus.jsonl.gz"
    with pytest.raises(DataPackError, match=r"dev.jsonl.gz not found .*it has: corpus.jsonl.gz"):
        pack_file("dev.jsonl.gz", tmp_path)


# ---------------------------------------------------------------- FlashRAG formats


FLASH_CORPUS = [
    {"id": "0", "contents": '"Alan Turing"\nAlan Turing was a mathematician.\nSecond line.'},
    {"id": 1, "contents": "Plain Title\nText without quoted title."},
    {"id": "2", "contents": "no newline at all"},
]
FLASH_QA = [
    {"id": "test_0", "question": "Who?", "golden_answers": ["Turing", "A. Turing"],
     "dataset": "nq", "split": "test", "metadata": {"k": 1}},
    {"id": 7, "question": "What?", "golden_answers": "bare string"},
]


def _check_flash_corpus(ps):
    assert ps[0] == Passage("0", "Alan Turing", "Alan Turing was a mathematician.\nSecond line.")
    assert ps[1] == Passage("1", "Plain Title", "Text without quoted title.")
    assert ps[2] == Passage("2", "", "no newline at all")
    assert ps[0].contents == FLASH_CORPUS[0]["contents"]


def _check_flash_qa(qs):
    assert qs[0] == QAExample("test_0", "Who?", ("Turing", "A. Turing"), "nq", "test", {"metadata": {"k": 1}})
    assert qs[1].id == "7" and qs[1].golden_answers == ("bare string",)
    assert qs[1].dataset == "unknown" and qs[1].split is None


@pytest.mark.parametrize("name,gz", [("c.jsonl", False), ("c.jsonl.gz", True)])
def test_flashrag_jsonl(tmp_path, name, gz):
    _check_flash_corpus(list(iter_corpus(write_jsonl(tmp_path / name, FLASH_CORPUS, gz=gz))))
    _check_flash_qa(list(iter_qa(write_jsonl(tmp_path / ("q" + name), FLASH_QA, gz=gz))))


def test_flashrag_parquet(tmp_path):
    cpath = tmp_path / "corpus.parquet"
    rows = [dict(r, id=str(r["id"])) for r in FLASH_CORPUS]
    pq.write_table(pa.Table.from_pylist(rows), cpath, row_group_size=2)
    _check_flash_corpus(list(iter_corpus(cpath)))
    assert [n for n, _ in iter_records(cpath)] == [1, 2, 3]
    assert count_records(cpath) == 3

    qpath = tmp_path / "test.parquet"
    pq.write_table(pa.Table.from_pylist([dict(FLASH_QA[0]), dict(FLASH_QA[0], id="test_1")]), qpath)
    qs = list(iter_qa(qpath))
    assert qs[0] == QAExample("test_0", "Who?", ("Turing", "A. Turing"), "nq", "test", {"metadata": {"k": 1}})
    assert qs[1].id == "test_1"
    assert list(iter_qa(qpath, split="dev"))[0].split == "dev"


def test_parquet_bad_row_uses_row_number(tmp_path):
    p = tmp_path / "c.parquet"
    pq.write_table(pa.Table.from_pylist([{"id": "a", "title": "t", "text": "x"},
                                         {"id": "b", "title": "t", "text": None}]), p)
    with pytest.raises(BadRowError, match=r"c.parquet row 2: field 'text' must be a string"):
        list(iter_corpus(p))


def test_split_contents_quotes_inside_title():
    assert split_contents('"Say "hi""\nbody') == ('Say "hi"', "body")


# ---------------------------------------------------------------- errors


def test_bad_json_line(tmp_path):
    p = write_jsonl(tmp_path / "bad.jsonl", [{"id": "a", "title": "t", "text": "x"}, "", "{not json"])
    with pytest.raises(BadRowError) as e:
        list(iter_corpus(p))
    assert (e.value.path, e.value.line) == (p, 3)
    assert "bad.jsonl line 3: invalid JSON" in str(e.value)


def test_bad_json_line_gz(tmp_path):
    p = write_jsonl(tmp_path / "bad.jsonl.gz", ['{"id": 1}', "[1, 2]"], gz=True)
    with pytest.raises(BadRowError, match=r"bad.jsonl.gz line 2: expected a JSON object, got list"):
        list(iter_records(p))


def test_missing_field(tmp_path):
    p = write_jsonl(tmp_path / "corpus.jsonl", [{"id": "a", "title": "t", "text": "x"}, {"id": "b", "title": "t"}])
    with pytest.raises(BadRowError) as e:
        list(iter_corpus(p))
    assert str(e.value) == (f"{p} line 2: missing field 'text' "
                            "(expected {id, title, text} or FlashRAG {id, contents})")
    assert e.value.reason.startswith("missing field 'text'")


@pytest.mark.parametrize("row,reason", [
    ({"id": "a", "question": "q", "golden_answers": 5}, "'golden_answers' must be a non-empty list of strings"),
    ({"id": "a", "question": "q", "golden_answers": []}, "'golden_answers' must be a non-empty list of strings"),
    ({"id": "a", "question": "q", "golden_answers": ["x", 3]}, "'golden_answers' must be a non-empty list"),
    ({"id": "a", "question": "q"}, "missing field 'golden_answers'"),
    ({"id": "a", "question": "  ", "golden_answers": ["x"]}, "field 'question' is empty"),
    ({"question": "q", "golden_answers": ["x"]}, "missing field 'id'"),
    ({"id": None, "question": "q", "golden_answers": ["x"]}, "field 'id' must be"),
])
def test_bad_qa_rows(tmp_path, row, reason):
    p = write_jsonl(tmp_path / "qa.jsonl", [row])
    with pytest.raises(BadRowError, match=reason) as e:
        list(iter_qa(p))
    assert e.value.line == 1


def test_bad_mirage_answer(tmp_path):
    p = write_jsonl(tmp_path / "m.jsonl", [{"id": "m", "dataset": "x", "question": "q",
                                          "options": {"A": "a", "B": "b"}, "answer": "E"}])
    with pytest.raises(BadRowError, match="answer 'E' is not one of the options"):
        list(iter_mirage(p))


def test_unsupported_suffix(tmp_path):
    with pytest.raises(ValueError, match="unsupported file type 'x.csv'"):
        iter_corpus(tmp_path / "x.csv")


def test_truncated_gzip(tmp_path):
    p = write_jsonl(tmp_path / "c.jsonl.gz", [{"id": i, "title": "t", "text": "x" * 200} for i in range(200)], gz=True)
    p.write_bytes(p.read_bytes()[:-200])
    with pytest.raises(DataPackError, match="c.jsonl.gz: cannot read"):
        list(iter_corpus(p))


# ---------------------------------------------------------------- limits / streaming


def test_limit(tmp_path):
    rows = [{"id": i, "title": "t", "text": str(i)} for i in range(10)] + ["{broken"]
    p = write_jsonl(tmp_path / "c.jsonl", rows)
    assert [x.text for x in iter_corpus(p, limit=3)] == ["0", "1", "2"]
    assert list(iter_corpus(p, limit=0)) == []
    assert len(list(iter_corpus(p, limit=10))) == 10  # stops before the broken line
    with pytest.raises(BadRowError):
        list(iter_corpus(p, limit=11))
    with pytest.raises(ValueError):
        iter_corpus(p, limit=-1)
    assert count_records(p) == 11


def test_count_skips_blank_lines(tmp_path):
    p = write_jsonl(tmp_path / "c.jsonl", ['{"a": 1}', "", "   ", '{"a": 2}'])
    assert count_records(p) == 2
    assert [n for n, _ in iter_records(p)] == [1, 4]
