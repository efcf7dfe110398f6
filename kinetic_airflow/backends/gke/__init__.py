"""GKE backend: one batch/v1 Job per attempt (``gke``), observed through a shared watch."""
