"""Dashboard pages (server-rendered, behind login)."""

from django.urls import path

from billing import queue_views, views, workload_views

urlpatterns = [
    path("", views.overview, name="overview"),
    path("overview/workloads/", views.overview_workloads_panel, name="overview-workloads"),
    path("fleet/", views.fleet_board, name="fleet-board"),
    path("fleet/heatmap/", views.heatmap, name="heatmap"),
    path("gpus/<str:uuid>/", views.gpu_detail, name="gpu-detail"),
    path("chargeback/", views.chargeback, name="chargeback"),
    path("chargeback/teams/<str:name>/", views.team_statement, name="team-statement"),
    path("chargeback/focus/", views.focus_export_create, name="focus-export-create"),
    path("chargeback/focus/<int:pk>/", views.focus_export_download, name="focus-export-download"),
    path("breakeven/", views.breakeven, name="breakeven"),
    path("workloads/", workload_views.workloads, name="workloads"),
    path("workloads/<int:pk>/", workload_views.workload_detail, name="workload-detail"),
    path("queue/", queue_views.queue_page, name="queue-page"),
]
