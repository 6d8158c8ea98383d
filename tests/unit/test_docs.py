"""The README stays true to the code: every setting is documented under its variable."""

from pydantic import BaseModel

from shared.config import QuireSettings
from tests.support.layout import ROOT


def env_names(model: type[BaseModel], prefix: str = "QUIRE_") -> list[str]:
    names = []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            names.extend(env_names(annotation, f"{prefix}{name.upper()}__"))
        else:
            names.append(f"{prefix}{name.upper()}")
    return names


def test_every_setting_is_in_the_readme() -> None:
    readme = (ROOT / "README.md").read_text()
    missing = [name for name in env_names(QuireSettings) if f"`{name}`" not in readme]
    assert not missing, f"README.md does not document {missing}"


def test_architecture_page_names_only_what_exists() -> None:
    """docs/architecture.md walks a newcomer through files and functions by name
    (`path.py:name` or `path.py:Class.method`): each file must exist and define each name."""
    import re

    text = (ROOT / "docs" / "architecture.md").read_text()
    refs = re.findall(r"`((?:services|shared|quire)/[\w/]+\.py):\s*([\w.]+)`", text)
    assert len(refs) > 20, "the page names the code it describes"
    wrong = []
    for path, dotted in refs:
        source = ROOT / path
        if not source.exists():
            wrong.append(f"{path} (no such file)")
            continue
        code = source.read_text()
        for name in dotted.split("."):
            if not re.search(rf"^\s*(?:async def|def|class) {name}\b", code, re.M):
                wrong.append(f"{path}:{dotted} ({name} not defined there)")
    paths = re.findall(r"`((?:services|shared|quire|tests)/[\w/]+\.py)`", text)
    wrong += [f"{p} (no such file)" for p in paths if not (ROOT / p).exists()]
    assert not wrong, f"docs/architecture.md names what is not there: {wrong}"
