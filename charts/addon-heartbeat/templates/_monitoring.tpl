{{/*
The job label of the webhook's metrics in Prometheus: monitoring.prometheusRule.webhookJob, or what the
chart's ServiceMonitor gives them (the Prometheus Operator names a ServiceMonitor's job after the Service).
*/}}
{{- define "addon-heartbeat.webhookJob" -}}
{{- default (include "addon-heartbeat.serviceName" .) .Values.monitoring.prometheusRule.webhookJob }}
{{- end }}

{{/*
Labels of a monitoring object: the chart's, and extra ones. Call with (dict "extra" <map> "context" $).
*/}}
{{- define "addon-heartbeat.monitoringLabels" -}}
{{ include "addon-heartbeat.labels" .context }}
{{- with .extra }}
{{ toYaml . }}
{{- end }}
{{- end }}
