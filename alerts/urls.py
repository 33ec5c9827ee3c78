"""The Alerts page (server-rendered, behind login)."""

from django.urls import path

from alerts import views

urlpatterns = [path("", views.alerts_page, name="alerts")]
