"""The Django admin's user forms apply the console's name rule (``console.accounts.username_taken``):
no two accounts whose names fold to one sign-in lock."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import UserAdmin
from django.contrib.auth.forms import AdminUserCreationForm, UserChangeForm
from django.core.exceptions import ValidationError

from console.accounts import username_taken


class _LockSafeName:
    """Form mixin: ``clean_username`` refuses a name that case-folds to another account's."""

    instance: Any
    cleaned_data: dict[str, Any]

    def clean_username(self) -> Any:
        name = self.cleaned_data.get("username")
        parent = getattr(super(), "clean_username", None)
        if parent is not None:
            name = parent()
        problem = username_taken(str(name or ""), exclude_pk=self.instance.pk)
        if problem:
            raise ValidationError(problem)
        return name


class ConsoleUserCreationForm(_LockSafeName, AdminUserCreationForm):
    """Django's add-user form with the console's name rule."""


class ConsoleUserChangeForm(_LockSafeName, UserChangeForm):
    """Django's change-user form with the console's name rule (a rename cannot collide)."""


class ConsoleUserAdmin(UserAdmin):
    """Django's user admin with forms that keep one sign-in lock per account."""

    add_form = ConsoleUserCreationForm
    form = ConsoleUserChangeForm


admin.site.unregister(get_user_model())
admin.site.register(get_user_model(), ConsoleUserAdmin)
