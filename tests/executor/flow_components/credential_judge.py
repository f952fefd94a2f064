from lfx.custom.custom_component.component import Component
from lfx.io import MessageTextInput, Output, SecretStrInput, StrInput
from lfx.schema.message import Message


class CredentialJudge(Component):
    """What a model-provider component decides before it sends its key: lfx's guard that keeps
    a credential held in the server environment away from endpoints the operator did not
    sanction (`ensure_credential_endpoint_allowed`). Reports the verdict, never the key."""

    display_name = "Credential Judge"
    inputs = [
        MessageTextInput(name="input_value", display_name="Input"),
        SecretStrInput(
            name="api_key", display_name="API Key", value="PARITY_PROVIDER_KEY", load_from_db=True
        ),
        StrInput(name="base_url", display_name="Base URL", value="http://10.213.1.2:9/v1"),
    ]
    outputs = [Output(display_name="Message", name="message", method="judge")]

    def judge(self) -> Message:
        from lfx.base.models.provider_ssrf import ensure_credential_endpoint_allowed

        try:
            ensure_credential_endpoint_allowed(
                self.api_key,
                self.base_url,
                default_url="https://api.openai.com/v1",
                sdk_env_fallback="OPENAI_API_KEY",
            )
        except ValueError as exc:
            return Message(text=f"refused: {exc}")
        return Message(text=f"allowed ({'a key' if self.api_key else 'no key'})")
