from typing import Any

from oauth2_provider.oauth2_validators import OAuth2Validator


class GroupsValidator(OAuth2Validator):
    """Adds the claims the product reads: its groups (the role claim), name and address."""

    # None: every claim goes out whatever the scopes (the default maps claims to scopes, and
    # `groups` belongs to none).
    oidc_claim_scope = None

    def get_additional_claims(self, request: Any) -> dict[str, Any]:
        user = request.user
        return {
            "preferred_username": user.username,
            "email": user.email,
            "given_name": user.first_name,
            "groups": sorted(user.groups.values_list("name", flat=True)),
        }
