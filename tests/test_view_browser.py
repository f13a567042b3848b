"""The tree page in a real headless Chromium, opened from disk as a person would open it.

The browser is the system's (Debian's chromium + chromium-driver, see .ci/run), driven by Selenium;
without it these tests skip and say why.
"""
from __future__ import annotations

from collections import Counter

import pytest
from view_runs import records, rewrite, solve_run

from seed_tot.view.browser import console_errors, headless_chromium, missing_reason, open_page, requested_urls
from seed_tot.view.page import write_page

pytestmark = pytest.mark.skipif(missing_reason() is not None, reason=f"no headless browser: {missing_reason()}")

THOUGHTS_JS = "return [...arguments[0].querySelectorAll('li.node > .head .thought')].map(e => e.textContent)"


@pytest.fixture(scope="module")
def browser():
    with headless_chromium() as driver:
        yield driver


@pytest.fixture(scope="module")
def one_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("view")
    run = solve_run(root / "run")
    return run, write_page([run], root / "page.html")


def css(driver, selector, within=None):
    return (within or driver).find_elements("css selector", selector)


def open_problem(driver, pid):
    next(li for li in css(driver, "#problems li") if li.get_attribute("data-id") == pid).click()


def test_page_opens_from_disk_without_console_errors_or_network_requests(browser, one_run):
    run, page = one_run
    open_page(browser, page)
    open_problem(browser, records(run)[0]["id"])
    css(browser, "li.node > .head")[0].click()
    assert console_errors(browser) == []
    urls = requested_urls(browser)
    assert page.resolve().as_uri() in urls  # the log sees the page's own load, so it would see others
    assert all(u == page.resolve().as_uri() or u.startswith("data:") for u in urls), urls


def test_no_request_leaves_the_page_even_when_its_script_asks(browser, one_run):
    """The page's Content-Security-Policy is what keeps it offline: a fetch from it is refused."""
    open_page(browser, one_run[1])
    requested_urls(browser)
    refused = browser.execute_async_script(
        "const done = arguments[0]; fetch('https://example.com/x').then(() => done(false), () => done(true));")
    assert refused and not [u for u in requested_urls(browser) if u.startswith("http")]
    assert any("Content Security Policy" in e for e in console_errors(browser))  # read, so later tests start clean


def test_opened_problem_shows_every_thought_and_the_kept_and_pruned_counts(browser, one_run):
    run, page = one_run
    open_page(browser, page)
    assert css(browser, "li.node") == []  # no tree is drawn before its problem is opened
    for record in records(run):
        open_problem(browser, record["id"])
        column = css(browser, ".tree-col")[0]
        thoughts = [t for step in record["steps"] for t in step["thoughts"]]
        assert Counter(browser.execute_script(THOUGHTS_JS, column)) == Counter(thoughts)
        n_kept = sum(len(step["kept"]) for step in record["steps"])
        assert len(css(browser, "li.node.kept", column)) == n_kept
        assert len(css(browser, "li.node.pruned", column)) == len(thoughts) - n_kept
        assert len(css(browser, "li.node.chosen", column)) == len(record["steps"])


def test_expanding_a_node_shows_its_evaluation_and_engine_work(browser, one_run):
    run, page = one_run
    record = records(run)[0]
    open_page(browser, page)
    open_problem(browser, record["id"])
    node = css(browser, "li.node.pruned")[0]
    assert not any(b.is_displayed() for b in css(browser, ".body", node))
    css(browser, ".head", node)[0].click()
    body = css(browser, ".body", node)[0]
    step, i = int(node.get_attribute("data-step")), int(node.get_attribute("data-idx"))
    reply = record["node_work"][step]["value_replies"][i]
    assert body.is_displayed() and "pruned" in body.text and reply.splitlines()[0] in body.text
    tokens = record["node_work"][step]["thought_work"][i]["new_tokens"]
    thought_row = css(body, "table tr")[1]  # header, thought, evaluation
    assert css(thought_row, "td")[0].text == f"{tokens:g}"
    css(browser, ".head", node)[0].click()
    assert not body.is_displayed()


def test_filter_keeps_wrong_problems_and_searches_ids(browser, one_run):
    run, page = one_run
    wrong = [r["id"] for r in records(run) if not r["correct"]]
    open_page(browser, page)
    browser.find_element("css selector", "#filter option[value='wrong']").click()
    assert [li.get_attribute("data-id") for li in css(browser, "#problems li") if li.is_displayed()] == wrong
    browser.find_element("css selector", "#filter option[value='all']").click()
    browser.find_element("css selector", "#search").send_keys("1")
    assert [li.get_attribute("data-id") for li in css(browser, "#problems li") if li.is_displayed()] == ["1"]


def test_two_run_comparison_marks_the_planted_difference(browser, tmp_path):
    base, other = solve_run(tmp_path / "ar"), solve_run(tmp_path / "seed")
    rewrite(other, lambda rows: rows[1]["steps"][1]["thoughts"].__setitem__(4, "a planted thought"))
    page = write_page([base, other], tmp_path / "both.html")
    open_page(browser, page)
    marked = [li.get_attribute("data-id") for li in css(browser, "#problems li") if "≠" in li.text]
    assert marked == [records(base)[1]["id"]]
    open_problem(browser, marked[0])
    columns = css(browser, ".tree-col")
    assert len(columns) == 2 and "step 2" in browser.find_element("css selector", ".differs-banner").text
    for column in columns:
        differing = css(browser, "li.node.differs", column)
        assert [(d.get_attribute("data-step"), d.get_attribute("data-idx")) for d in differing] == [("1", "4")]
    assert "a planted thought" in css(browser, "li.node.differs", columns[1])[0].text
    open_problem(browser, records(base)[0]["id"])
    assert css(browser, "li.node.differs") == [] and css(browser, ".same-banner")
    assert console_errors(browser) == []


def test_run_with_missing_fields_renders_and_names_them(browser, tmp_path):
    run = solve_run(tmp_path / "old")

    def age(rows):
        del rows[0]["node_work"], rows[0]["stats"]
        rows[1] = {"id": rows[1]["id"], "error": "worker died"}

    rewrite(run, age)
    (run / "summary.json").unlink()
    page = write_page([run], tmp_path / "old.html")
    open_page(browser, page)
    assert "summary.json missing" in browser.find_element("css selector", "#run-header").text
    for pid, named in ((records(run)[0]["id"], "node_work"), (records(run)[1]["id"], "worker died")):
        open_problem(browser, pid)
        assert named in " ".join(m.text for m in css(browser, "#detail .missing"))
    open_problem(browser, records(run)[0]["id"])
    css(browser, "li.node > .head")[0].click()
    assert "none recorded" in css(browser, "li.node.open .body")[0].text
    assert console_errors(browser) == []
