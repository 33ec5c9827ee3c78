import pytest

pytestmark = [pytest.mark.smoke, pytest.mark.django_db]


def test_role_groups_exist_after_migrate():
    from django.contrib.auth.models import Group

    perms = {
        g.name: sorted(g.permissions.values_list("codename", flat=True))
        for g in Group.objects.all()
    }
    assert perms == {
        "viewer": ["view_dashboard"],
        "finance": ["view_costs", "view_dashboard"],
        "admin": ["manage_fleet", "view_costs", "view_dashboard"],
    }
