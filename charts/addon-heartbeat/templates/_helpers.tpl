{{/*
Chart name, truncated to 63 characters (a DNS label).
*/}}
{{- define "addon-heartbeat.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Name prefix of every resource: the release name, plus the chart name unless the release name already
contains it. Truncated so that the longest suffix used below (-webhook-tls) still fits a DNS label.
*/}}
{{- define "addon-heartbeat.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "addon-heartbeat.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels of every resource.
*/}}
{{- define "addon-heartbeat.labels" -}}
helm.sh/chart: {{ include "addon-heartbeat.chart" . }}
{{ include "addon-heartbeat.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/*
Labels that select the webhook pods. Never change them: a Deployment's selector is immutable.
*/}}
{{- define "addon-heartbeat.selectorLabels" -}}
app.kubernetes.io/name: {{ include "addon-heartbeat.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: webhook
{{- end }}

{{/* Names of the resources, one helper each so that templates and flags agree. */}}
{{- define "addon-heartbeat.serviceAccountName" -}}
{{- include "addon-heartbeat.fullname" . }}
{{- end }}
{{- define "addon-heartbeat.serviceName" -}}
{{- include "addon-heartbeat.fullname" . }}-webhook
{{- end }}
{{- define "addon-heartbeat.webhookConfigurationName" -}}
{{- include "addon-heartbeat.fullname" . }}
{{- end }}
{{- define "addon-heartbeat.webhookRoleName" -}}
{{- include "addon-heartbeat.fullname" . }}-webhook
{{- end }}
{{- define "addon-heartbeat.reporterRoleName" -}}
{{- include "addon-heartbeat.fullname" . }}-reporter
{{- end }}
{{/*
The Secret holding the key that signs the webhook's status records.
*/}}
{{- define "addon-heartbeat.signingSecretName" -}}
{{ include "addon-heartbeat.fullname" . }}-webhook-signing-key
{{- end }}

{{- define "addon-heartbeat.tlsSecretName" -}}
{{- include "addon-heartbeat.fullname" . }}-webhook-tls
{{- end }}
{{- define "addon-heartbeat.leaderElectionID" -}}
{{- include "addon-heartbeat.fullname" . }}-webhook
{{- end }}
{{- define "addon-heartbeat.servingCertificateName" -}}
{{- include "addon-heartbeat.fullname" . }}-serving
{{- end }}
{{- define "addon-heartbeat.caName" -}}
{{- include "addon-heartbeat.fullname" . }}-ca
{{- end }}
{{- define "addon-heartbeat.selfSignedIssuerName" -}}
{{- include "addon-heartbeat.fullname" . }}-selfsigned
{{- end }}

{{/*
Image reference: repository@digest when a digest is set, else repository:tag (the appVersion by
default). Call with (dict "image" .Values.image "context" $).
*/}}
{{- define "addon-heartbeat.image" -}}
{{- if .image.digest }}
{{- printf "%s@%s" .image.repository .image.digest }}
{{- else }}
{{- printf "%s:%s" .image.repository (default .context.Chart.AppVersion .image.tag) }}
{{- end }}
{{- end }}

{{/*
DNS names of the webhook Service, for its serving certificate.
*/}}
{{- define "addon-heartbeat.serviceDNSNames" -}}
{{- $svc := include "addon-heartbeat.serviceName" . }}
{{- $ns := .Release.Namespace }}
{{- list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns) | toJson }}
{{- end }}

{{/*
The namespace selector of the webhook, as JSON. The system namespaces and the release namespace are
always left out; the user's namespaceSelector adds to that. The webhook configuration and the RBAC
controller (--namespace-selector) both use exactly this selector.
*/}}
{{- define "addon-heartbeat.namespaceSelector" -}}
{{- $user := .Values.webhook.namespaceSelector }}
{{- $exclude := dict "key" "kubernetes.io/metadata.name" "operator" "NotIn" "values" (list "kube-system" "kube-public" "kube-node-lease" .Release.Namespace) }}
{{- $sel := dict "matchExpressions" (prepend (default (list) $user.matchExpressions) $exclude) }}
{{- with $user.matchLabels }}
{{- $_ := set $sel "matchLabels" . }}
{{- end }}
{{- toJson $sel }}
{{- end }}

{{/*
Lease names of the reporters, one per AddonInstance name, computed as the reporter does
(pkg/heartbeat.LeaseName): "addon-heartbeat-<instance>", shortened with a hash suffix past 63 characters.
*/}}
{{- define "addon-heartbeat.reporterLeaseNames" -}}
{{- $names := list }}
{{- range .Values.reporter.addonInstanceNames }}
{{- $name := printf "addon-heartbeat-%s" . }}
{{- if gt (len $name) 63 }}
{{- $name = printf "%s-%s" (regexReplaceAll "[.-]+$" ($name | trunc 52) "") (sha256sum . | trunc 10) }}
{{- end }}
{{- $names = append $names $name }}
{{- end }}
{{- toJson $names }}
{{- end }}

{{/*
The platform the chart installs for, kubernetes or openshift: the platform value, or with auto, openshift
when the API server serves OpenShift's security.openshift.io/v1 (SecurityContextConstraints), else
kubernetes. It decides the webhook pods' security context (addon-heartbeat.podSecurityContext,
addon-heartbeat.containerSecurityContext) and the injected reporter's (--platform).
*/}}
{{- define "addon-heartbeat.platform" -}}
{{- if ne .Values.platform "auto" }}
{{- .Values.platform }}
{{- else if .Capabilities.APIVersions.Has "security.openshift.io/v1" }}
{{- "openshift" }}
{{- else }}
{{- "kubernetes" }}
{{- end }}
{{- end }}

{{/*
Security context of the webhook pods. On kubernetes, the restricted Pod Security profile in full. On
openshift, runAsUser, runAsGroup and seccompProfile are left to the SCC, as for the injected reporter
(pkg/inject): restricted-v2 refuses a UID outside the namespace's range, such as 65532, and sets the
RuntimeDefault profile on the pod; anyuid, restricted and nonroot refuse any seccomp profile.
*/}}
{{- define "addon-heartbeat.podSecurityContext" -}}
runAsNonRoot: true
{{- if ne (include "addon-heartbeat.platform" .) "openshift" }}
seccompProfile:
  type: RuntimeDefault
{{- end }}
{{- end }}

{{/*
Security context of the webhook container (see addon-heartbeat.podSecurityContext).
*/}}
{{- define "addon-heartbeat.containerSecurityContext" -}}
{{- $kubernetes := ne (include "addon-heartbeat.platform" .) "openshift" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
{{- if $kubernetes }}
runAsUser: 65532
runAsGroup: 65532
{{- end }}
capabilities:
  drop: ["ALL"]
{{- if $kubernetes }}
seccompProfile:
  type: RuntimeDefault
{{- end }}
{{- end }}

{{/*
The fencing ValidatingAdmissionPolicy and its binding (one name for both; cluster-scoped).
*/}}
{{- define "addon-heartbeat.fencingPolicyName" -}}
{{- include "addon-heartbeat.fullname" . }}-fencing
{{- end }}

{{/*
Whether the fencing policy is installed: fencing.enabled, on an API server that serves
admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy (Kubernetes 1.30+; the binding is served with it).
*/}}
{{- define "addon-heartbeat.fencing" -}}
{{- if and .Values.fencing.enabled (.Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy") }}
{{- "true" }}
{{- end }}
{{- end }}
