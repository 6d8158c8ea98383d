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
