"""Schemathesis hooks for Quire (loaded with SCHEMATHESIS_HOOKS=tests.support.schemathesis_hooks).

Quire's one documented 5xx that well-formed input can cause is 503 NOT_ENOUGH_BOOKIES (an
ensemble larger than the cluster). Every other 5xx is a bug."""

import schemathesis

DOCUMENTED_5XX = {(503, "NOT_ENOUGH_BOOKIES")}


@schemathesis.check
def no_unexpected_server_error(ctx, response, case):
    if response.status_code < 500:
        return None
    try:
        code = response.json().get("code")
    except ValueError:
        code = None
    if (response.status_code, code) in DOCUMENTED_5XX:
        return None
    raise AssertionError(f"server error {response.status_code} {code}: {response.text[:300]}")
