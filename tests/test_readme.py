"""The README and the docs tell the truth about what exists."""

from __future__ import annotations

from pathlib import Path

from fanout.upstream import MODELS

from .docs import README, page

UPSTREAM = page("mock.md")
CONFIGURATION = page("configuration.md")
GETTING_STARTED = page("getting-started.md")
COMPARE = page("compare.md")


def test_every_upstream_model_is_documented() -> None:
    for model in MODELS:
        assert f"| `{model}` |" in UPSTREAM, model


def test_the_two_commands_are_stated() -> None:
    for text in (README, GETTING_STARTED):
        assert "make test" in text and "make demo" in text


def test_the_config_errors_shown_are_the_real_ones() -> None:
    import pytest

    from fanout import ConfigError
    from fanout.config import parse_config

    models = ("[[models]]\nname = 'gpt-4o'\nid = 'x'\n[[models]]\nname = 'claude-sonnet'\n"
              "id = 'y'\n")
    broken = [
        "[deadlines]\nidel = 3\n",
        models + "[[models]]\nname = 'fast'\nid = 'z'\ntemperature = 0.2\n",
        "[deadlines]\nidle = -1\n",
    ]
    for text in broken:
        with pytest.raises(ConfigError) as caught:
            parse_config(text, "fanout.toml")
        assert f"fanout compare: {caught.value}\n" in CONFIGURATION
    config = parse_config("[endpoint]\nbase_url = 'https://r/v1'\n"
                          "api_key_env = 'RELAY_API_KEY'\n" + models, "fanout.toml")
    # An unknown name is an error where the endpoint is the embedded upstream (a real
    # endpoint takes it as a model id).
    embedded = parse_config("[endpoint]\nbase_url = 'embedded'\n" + models, "fanout.toml")
    for call in (lambda: config.endpoint({}), lambda: embedded.model("gtp-4o")):
        with pytest.raises(ConfigError) as caught:
            call()
        assert f"fanout compare: {caught.value}\n" in CONFIGURATION


def test_make_demo_is_what_the_readme_says() -> None:
    makefile = (Path(__file__).parent.parent / "Makefile").read_text()
    assert 'DEMO_PROMPT ?= Tell me about rivers, in a few sentences.' in makefile
    assert 'fanout compare "$(DEMO_PROMPT)" --config config/default.toml' in makefile
    assert ('`fanout compare "Tell me about rivers, in a few sentences." --config '
            'config/default.toml`') in GETTING_STARTED


def test_every_json_record_type_is_documented() -> None:
    from fanout.records import _TYPES

    section = COMPARE[COMPARE.index("- `--json`: one JSON object per event"):]
    section = section[:section.index("\n- ") if "\n- " in section else len(section)]
    for name in _TYPES.values():
        assert f"`{name}`" in section, name
