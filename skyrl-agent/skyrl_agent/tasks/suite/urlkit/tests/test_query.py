from urlkit import build_query, parse_query


def test_repeated_keys():
    assert parse_query("a=1&a=2&b=3") == {"a": ["1", "2"], "b": ["3"]}


def test_leading_question_mark():
    assert parse_query("?x=1") == {"x": ["1"]}


def test_build_query_escapes():
    assert build_query({"q": "a&b", "n": ["1", "2"]}) == "q=a%26b&n=1&n=2"
