from __future__ import annotations

import pytest

from remediator.domain import templating

CONTEXT = {
    "labels": {"node": "gpu-node-01", "pod": "", "exported_pod": "trainer-0"},
    "annotations": {"summary": "hot"},
    "target": {"node": "gpu-node-01"},
}


def test_references_are_rendered_from_the_context():
    text = "{{ target.node }}: {{ annotations.summary }}"
    assert templating.render(text, CONTEXT) == "gpu-node-01: hot"


def test_fallbacks_take_the_first_non_empty_value():
    assert templating.render("{{ labels.pod or labels.exported_pod }}", CONTEXT) == "trainer-0"
    assert templating.render('{{ labels.missing or "all" }}', CONTEXT) == "all"


def test_a_missing_value_without_fallback_is_an_error():
    with pytest.raises(templating.MissingValue):
        templating.render("{{ labels.missing }}", CONTEXT)


@pytest.mark.parametrize(
    "text",
    [
        "{{ __import__('os').system('id') }}",
        "{{ labels.node.upper() }}",
        "{{ config.secret }}",
        "{{ target.anything }}",
        "{{ labels.node }",
        "{{ labels.node | upper }}",
        "{{ }}",
    ],
)
def test_anything_beyond_simple_references_is_refused_at_load_time(text):
    with pytest.raises(templating.TemplateError):
        templating.validate(text)


def test_rendered_values_are_never_evaluated():
    hostile = {"labels": {"node": "$(reboot); {{ labels.node }}"}}
    assert templating.render("{{ labels.node }}", hostile) == "$(reboot); {{ labels.node }}"


def test_templated_paths_name_each_templated_leaf():
    params = {"a": "{{ labels.x }}", "b": 1, "c": ["x", "{{ target.node }}"]}
    assert templating.templated_paths(params) == {("a",), ("c", 1)}
