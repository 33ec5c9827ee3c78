"""Dashboard pages (server-rendered, behind login)."""

from django.urls import path

from billing import views

urlpatterns = [
    path("", views.overview, name="overview"),
]
