"""The router's tokenizer and chat templates (no transformers at serving time)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from tgictl.errors import TemplateError
from tgictl.runtime.router.text.tokenizer import ChatTemplate, RouterTokenizer

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hello there"},
    {"role": "assistant", "content": "Hi!"},
    {"role": "user", "content": "How are you?"},
]


def test_rendering_and_ids_equal_transformers(tiny_model_dir: Path) -> None:
    ours = RouterTokenizer(tiny_model_dir)
    reference = AutoTokenizer.from_pretrained(tiny_model_dir)
    text = ours.apply_chat_template(MESSAGES)
    assert text == reference.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert ours.encode(text, add_special_tokens=False) == reference(text, add_special_tokens=False)["input_ids"]
    assert ours.eos_token == reference.eos_token
    assert reference.convert_tokens_to_ids(ours.eos_token) in ours.special_ids


def copy_with_template(src: Path, dst: Path, template: str, *, as_jinja_file: bool) -> Path:
    shutil.copytree(src, dst)
    config_path = dst / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    if as_jinja_file:
        (dst / "chat_template.jinja").write_text(template)
    else:
        config["chat_template"] = template
    config_path.write_text(json.dumps(config))
    return dst


def test_a_jinja_file_wins_over_tokenizer_config(tiny_model_dir: Path, tmp_path: Path) -> None:
    model = copy_with_template(tiny_model_dir, tmp_path / "m", "FILE {{ messages[0]['content'] }}", as_jinja_file=True)
    assert RouterTokenizer(model).apply_chat_template(MESSAGES) == "FILE Be brief."


def test_raise_exception_and_broken_templates_are_template_errors(tiny_model_dir: Path, tmp_path: Path) -> None:
    raising = copy_with_template(
        tiny_model_dir, tmp_path / "r", "{{ raise_exception('roles must alternate') }}", as_jinja_file=False
    )
    with pytest.raises(TemplateError, match="Template error: roles must alternate"):
        RouterTokenizer(raising).apply_chat_template(MESSAGES)
    broken = copy_with_template(tiny_model_dir, tmp_path / "b", "{% for %}", as_jinja_file=False)
    tokenizer = RouterTokenizer(broken)  # loads: /generate still works without a template
    with pytest.raises(TemplateError) as info:
        tokenizer.apply_chat_template(MESSAGES)
    assert info.value.http_status == 422 and info.value.error_type == "template_error"


def test_the_sandbox_refuses_attribute_escapes(tiny_model_dir: Path, tmp_path: Path) -> None:
    evil = copy_with_template(
        tiny_model_dir, tmp_path / "e", "{{ ''.__class__.__mro__[1].__subclasses__() }}", as_jinja_file=False
    )
    with pytest.raises(TemplateError):
        RouterTokenizer(evil).apply_chat_template(MESSAGES)


def test_template_kwargs_reach_the_template_but_never_replace_its_variables() -> None:
    template = ChatTemplate("{{ greeting }} {{ messages | length }}{% if add_generation_prompt %}!{% endif %}", None, None)
    messages = [{"role": "user", "content": "hi"}]
    assert template.render(messages, extra={"greeting": "hello"}) == "hello 1!"
    assert template.render(messages, extra={"messages": [], "add_generation_prompt": False}) == " 1!"
