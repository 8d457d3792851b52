from minimark import render


def test_heading_level_one():
    assert render("# Title") == "<h1>Title</h1>"


def test_paragraphs_join_lines():
    assert render("one\ntwo\n\nthree") == "<p>one two</p>\n<p>three</p>"


def test_list_followed_by_blank_line():
    assert render("- a\n- b\n\nafter") == "<ul><li>a</li><li>b</li></ul>\n<p>after</p>"
