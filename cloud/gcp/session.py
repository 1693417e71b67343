"""Where rubberband's GCP clients point: the environment that redirects Compute Engine, IAM and Resource Manager
calls (tests: the local GCE fake) and names the project. Shared by the provider and the identity set-up, below
both."""

from __future__ import annotations

#: A base URL that replaces Google's endpoints for every GCP call rubberband makes (tests: the GCE fake).
ENDPOINT_ENV = "RUBBERBAND_GCE_ENDPOINT"
#: The project to use (else the application default credentials' project).
PROJECT_ENV = "RUBBERBAND_GCP_PROJECT"
