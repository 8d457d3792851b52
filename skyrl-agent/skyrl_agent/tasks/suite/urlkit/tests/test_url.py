import pytest

from urlkit import join_path, split_url


def test_split_with_port():
    url = split_url("http://Example.org:8080/a/b?x=1")
    assert (url.scheme, url.host, url.port, url.path, url.query) == ("http", "example.org", 8080, "/a/b", "x=1")


def test_default_http_port():
    assert split_url("http://example.org").port == 80


def test_missing_scheme():
    with pytest.raises(ValueError):
        split_url("example.org/path")


def test_join_simple():
    assert join_path("/api", "v1", "users") == "/api/v1/users"
