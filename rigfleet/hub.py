"""The Hugging Face hub through ``huggingface_hub``; the token stays in memory, failures are
``HubMissing`` (the hub said no), ``HubUnreachable`` or ``HubError``::

    hub = Hub("https://huggingface.co", token_file="~/.config/rigfleet/hf-token")
    hub.files("Lorbus/Qwen3.6-27B-int4-AutoRound", "74647d59...")  # ["config.json", ...]
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

from rigfleet.validate import TOKEN_ALLOWED, TOKEN_CHARS, secret_text

if TYPE_CHECKING:
    from huggingface_hub import HfApi

DEFAULT_HUB = "https://huggingface.co"


class HubError(RuntimeError):
    """The hub answered something unusable (the message says what and where)."""


class HubMissing(HubError):
    """The hub says the repository or revision is not there (or not for this caller)."""


class HubUnreachable(HubError):
    """The hub could not be reached at all (DNS, connection, timeout), or answered nothing
    about the model (HTTP 429 rate limit, 5xx)."""


@dataclass
class Hub:
    """One hub endpoint (``hf_endpoint``, else huggingface.co) and the caller's token."""

    endpoint: str = DEFAULT_HUB
    token_file: str | None = None
    timeout: float = 15.0

    @property
    def where(self) -> str:
        return self.endpoint.rstrip("/")

    @cached_property
    def api(self) -> HfApi:
        token = ""  # never printed
        if self.token_file:
            try:
                token = secret_text(self.token_file, errors="replace")
            except OSError as e:
                raise HubError(f"hf_token_file: {self.token_file!r} cannot be read "
                               f"({e.strerror})") from None
            if token and not TOKEN_CHARS.fullmatch(token):
                # An HTTP client refusing the header would show it in its error.
                raise HubError(f"hf_token_file: {self.token_file!r} is not one token (content "
                               f"not shown); allowed: one line of {TOKEN_ALLOWED}")
        from huggingface_hub import HfApi  # a third of a second: only when asked

        # token=False: no token at all (not the one huggingface_hub would find in ~/.cache)
        return HfApi(endpoint=self.where, token=token or False)

    def revision(self, repo: str, ref: str = "main") -> str:
        """The full commit ``ref`` (a branch, tag or commit) of model ``repo`` is."""
        sha = getattr(self._model_info(repo, ref), "sha", None) or ""
        if len(sha) != 40:
            raise HubError(f"hub {self.where}: {repo}@{ref}: the hub answered no full commit "
                           f"(sha={sha!r})")
        return str(sha)

    def files(self, repo: str, revision: str) -> list[str]:
        """Every file of model ``repo`` at ``revision`` (the model info's file list: one
        request, which huggingface_hub does not retry for minutes when the hub is away)."""
        info = self._model_info(repo, revision)
        return [str(s.rfilename) for s in (getattr(info, "siblings", None) or [])]

    def _model_info(self, repo: str, ref: str) -> Any:
        what = f"hub {self.where}: {repo}@{ref}"
        auth = "with the token of hf_token_file" if self.token_file else "without a token"
        from huggingface_hub import errors

        try:
            return self.api.model_info(repo, revision=ref, timeout=self.timeout)
        except errors.RevisionNotFoundError:
            raise HubMissing(f"{what}: no such revision (HTTP 404)") from None
        except errors.GatedRepoError:
            raise HubMissing(f"{what}: the model is gated and this caller ({auth}) has no "
                             "access; allowed: a token of an account that accepted the "
                             "model's terms, in hf_token_file") from None
        except errors.RepositoryNotFoundError:
            raise HubMissing(f"{what}: no such repository, or a private one {auth} cannot "
                             "see (HTTP 401/404)") from None
        except errors.HfHubHTTPError as e:
            status = getattr(getattr(e, "response", None), "status_code", None)
            # A rate limit or a server error says nothing of the model: the hub is away.
            away = isinstance(status, int) and (status == 429 or status >= 500)
            raise (HubUnreachable if away else HubError)(
                f"{what}: HTTP {status}: {str(e).splitlines()[0][:200]}") from None
        except (OSError, ValueError) as e:
            raise HubUnreachable(f"{what}: cannot reach the hub ({e})") from None
        except Exception as e:  # httpx / requests transport errors (not OSError subclasses)
            if type(e).__module__.split(".")[0] in ("httpx", "httpx2", "httpcore", "requests",
                                                    "urllib3"):
                raise HubUnreachable(f"{what}: cannot reach the hub ({type(e).__name__}: "
                                     f"{e})") from None
            raise
