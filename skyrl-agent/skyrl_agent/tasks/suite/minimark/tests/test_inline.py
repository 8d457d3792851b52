from minimark import render_inline


def test_plain_text():
    assert render_inline("hello") == "hello"


def test_bold_and_italic():
    assert render_inline("**a** and *b*") == "<strong>a</strong> and <em>b</em>"


def test_code_span():
    assert render_inline("run `ls`") == "run <code>ls</code>"


def test_link():
    assert render_inline("[docs](https://x.org)") == '<a href="https://x.org">docs</a>'


def test_escapes_angle_brackets():
    assert render_inline("a < b") == "a &lt; b"
