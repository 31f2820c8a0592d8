{{/* Chart name, possibly overridden. */}}
{{- define "stillthere.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Release-qualified name; the services' names append to it. */}}
{{- define "stillthere.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "stillthere.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "stillthere.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: stillthere
{{- end }}

{{/* Selector labels of one component: (list $ "gateway"). */}}
{{- define "stillthere.selectorLabels" -}}
{{- $ := index . 0 -}}
app.kubernetes.io/name: {{ include "stillthere.name" $ }}
app.kubernetes.io/instance: {{ $.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{- define "stillthere.componentLabels" -}}
{{ include "stillthere.labels" (index . 0) }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{- define "stillthere.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{- define "stillthere.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "stillthere.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "stillthere.secretName" -}}
{{- default (include "stillthere.fullname" .) .Values.secrets.existingSecret }}
{{- end }}

{{/* The environment variable of a setting given by flag name or variable. */}}
{{- define "stillthere.envName" -}}
{{- if hasPrefix "STILLTHERE_" . }}{{ . }}{{ else }}{{ printf "STILLTHERE_%s" (. | replace "-" "_" | upper) }}{{ end }}
{{- end }}

{{/*
A setting's value as a string. Helm reads every number as a float, which
would print 268435456 as 2.68435456e+08.
*/}}
{{- define "stillthere.settingValue" -}}
{{- if kindIs "float64" . }}
{{- if eq (float64 (int64 .)) . }}{{ int64 . }}{{ else }}{{ . }}{{ end }}
{{- else if kindIs "slice" . }}
{{- join "," . }}
{{- else }}
{{- . }}
{{- end }}
{{- end }}

{{/*
ConfigMap data of one service: typed settings, then the free-form map,
which may not set what the chart owns (listen addresses, the drain, the
spool directory) or a secret.
(dict "typed" dict "free" map "where" "gateway.config" "reserved" list)
*/}}
{{- define "stillthere.configData" -}}
{{- $out := dict }}
{{- range $k, $v := .typed }}
{{- if not (or (kindIs "invalid" $v) (and (kindIs "string" $v) (eq $v "")) (and (kindIs "slice" $v) (eq (len $v) 0))) }}
{{- $_ := set $out (include "stillthere.envName" $k) (include "stillthere.settingValue" $v) }}
{{- end }}
{{- end }}
{{- $secrets := list "STILLTHERE_TOKEN_SECRET" "STILLTHERE_PUSH_SECRET" "STILLTHERE_WEBHOOK_SECRET" "STILLTHERE_NOTIFY_SECRET" "STILLTHERE_ACTIVITY_SECRET" "STILLTHERE_OPS_SECRET" "STILLTHERE_REDIS_PASSWORD" "STILLTHERE_KAFKA_SASL_PASSWORD" }}
{{- $reserved := list }}
{{- range .reserved }}{{ $reserved = append $reserved (include "stillthere.envName" .) }}{{ end }}
{{- $seen := dict }}
{{- range $k, $v := .free }}
{{- $env := include "stillthere.envName" $k }}
{{- if has $env $secrets }}
{{- fail (printf "%s.%s: a secret does not belong in a ConfigMap; set it in secrets.* or secrets.existingSecret" $.where $k) }}
{{- end }}
{{- if has $env $reserved }}
{{- fail (printf "%s.%s: the chart sets %s itself; use the typed value instead (see values.yaml)" $.where $k $env) }}
{{- end }}
{{- if hasKey $seen $env }}
{{- fail (printf "%s: %s and %s are the same setting, %s; give it once" $.where (get $seen $env) $k $env) }}
{{- end }}
{{- $_ := set $seen $env $k }}
{{- $_ := set $out $env (include "stillthere.settingValue" $v) }}
{{- end }}
{{- range $k := keys $out | sortAlpha }}
{{ $k }}: {{ index $out $k | quote }}
{{- end }}
{{- end }}

{{/* extraEnv may not override what the chart derives other values from. */}}
{{- define "stillthere.checkExtraEnv" -}}
{{- $where := index . 0 }}
{{- $reserved := list }}
{{- range index . 2 }}{{ $reserved = append $reserved (include "stillthere.envName" .) }}{{ end }}
{{- range index . 1 }}
{{- if has .name $reserved }}
{{- fail (printf "%s: %s is set by the chart; use the typed value instead (see values.yaml)" $where .name) }}
{{- end }}
{{- end }}
{{- end }}

{{/* One secret env entry: (list $ "STILLTHERE_PUSH_SECRET" "push-secret"),
or (list $ name key true) for a key the Secret may lack (the setting is
then unset). */}}
{{- define "stillthere.secretEnv" -}}
{{- $ := index . 0 }}
- name: {{ index . 1 }}
  valueFrom:
    secretKeyRef:
      name: {{ include "stillthere.secretName" $ }}
      key: {{ index . 2 }}
      {{- if and (gt (len .) 3) (index . 3) }}
      optional: true
      {{- end }}
{{- end }}

{{/* Secret env shared by every service: Redis, and Kafka with (list $ true). */}}
{{- define "stillthere.backendSecretEnv" -}}
{{- $ := index . 0 }}
{{- if $.Values.redis.auth.enabled }}
{{ include "stillthere.secretEnv" (list $ "STILLTHERE_REDIS_PASSWORD" "redis-password") }}
{{- end }}
{{- if and (index . 1) (ne $.Values.kafka.sasl.mechanism "none") }}
{{ include "stillthere.secretEnv" (list $ "STILLTHERE_KAFKA_SASL_PASSWORD" "kafka-sasl-password") }}
{{- end }}
{{- end }}

{{/* Volumes every pod has: /tmp, and TLS files: (list $ withKafka). */}}
{{- define "stillthere.volumes" -}}
{{- $ := index . 0 }}
- name: tmp
  emptyDir:
    sizeLimit: {{ $.Values.tmpSizeLimit }}
{{- if and $.Values.redis.tls.enabled $.Values.redis.tls.secretName }}
- name: redis-tls
  secret:
    secretName: {{ $.Values.redis.tls.secretName }}
    defaultMode: 0440
{{- end }}
{{- if and (index . 1) $.Values.kafka.tls.enabled $.Values.kafka.tls.secretName }}
- name: kafka-tls
  secret:
    secretName: {{ $.Values.kafka.tls.secretName }}
    defaultMode: 0440
{{- end }}
{{- end }}

{{- define "stillthere.volumeMounts" -}}
{{- $ := index . 0 }}
- name: tmp
  mountPath: /tmp
{{- if and $.Values.redis.tls.enabled $.Values.redis.tls.secretName }}
- name: redis-tls
  mountPath: /etc/stillthere/tls/redis
  readOnly: true
{{- end }}
{{- if and (index . 1) $.Values.kafka.tls.enabled $.Values.kafka.tls.secretName }}
- name: kafka-tls
  mountPath: /etc/stillthere/tls/kafka
  readOnly: true
{{- end }}
{{- end }}

{{/* Settings of the Redis and Kafka connections, as ConfigMap data. */}}
{{- define "stillthere.tlsSettings" -}}
{{- $out := dict }}
{{- range $name, $tls := dict "redis" .Values.redis.tls "kafka" .Values.kafka.tls }}
{{- if $tls.enabled }}
{{- $_ := set $out (printf "%s-tls" $name) "true" }}
{{- $_ := set $out (printf "%s-tls-server-name" $name) $tls.serverName }}
{{- if $tls.secretName }}
{{- $dir := printf "/etc/stillthere/tls/%s" $name }}
{{- if $tls.caKey }}{{ $_ := set $out (printf "%s-tls-ca-file" $name) (printf "%s/%s" $dir $tls.caKey) }}{{ end }}
{{- if $tls.certKey }}{{ $_ := set $out (printf "%s-tls-cert-file" $name) (printf "%s/%s" $dir $tls.certKey) }}{{ end }}
{{- if $tls.keyKey }}{{ $_ := set $out (printf "%s-tls-key-file" $name) (printf "%s/%s" $dir $tls.keyKey) }}{{ end }}
{{- else if or $tls.certKey $tls.keyKey }}
{{- fail (printf "%s.tls.certKey and keyKey name keys of %s.tls.secretName, which is empty" $name $name) }}
{{- end }}
{{- if and (or $tls.certKey $tls.keyKey) (not (and $tls.certKey $tls.keyKey)) }}
{{- fail (printf "%s.tls: a client certificate needs both certKey and keyKey" $name) }}
{{- end }}
{{- end }}
{{- end }}
{{- toYaml $out }}
{{- end }}

{{/* The pod spec fields every service shares. */}}
{{- define "stillthere.podCommon" -}}
serviceAccountName: {{ include "stillthere.serviceAccountName" . }}
automountServiceAccountToken: false
enableServiceLinks: false
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* Scheduling fields of one service: its values block. */}}
{{- define "stillthere.scheduling" -}}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* Health probes on the internal port named "internal". */}}
{{- define "stillthere.probes" -}}
livenessProbe:
  httpGet:
    path: /healthz
    port: internal
  periodSeconds: 10
  timeoutSeconds: 2
  failureThreshold: 3
readinessProbe:
  httpGet:
    path: /readyz
    port: internal
  periodSeconds: 5
  timeoutSeconds: 3
  failureThreshold: 2
startupProbe:
  httpGet:
    path: /healthz
    port: internal
  periodSeconds: 2
  timeoutSeconds: 2
  failureThreshold: 30
{{- end }}

{{/*
Milliseconds in a Go duration such as 1m15s, 250ms or 0, as a float; fails
naming the value when it is not one: (list "listener.outageGrace" "75s").
*/}}
{{- define "stillthere.milliseconds" -}}
{{- $where := index . 0 }}
{{- $d := toString (index . 1) }}
{{- if not (regexMatch "^(0|([0-9]+(\\.[0-9]+)?(ns|us|µs|ms|s|m|h))+)$" $d) }}
{{- fail (printf "%s: %q is not a duration such as 75s or 1m30s" $where $d) }}
{{- end }}
{{- $unit := dict "ns" 0.000001 "us" 0.001 "µs" 0.001 "ms" 1.0 "s" 1000.0 "m" 60000.0 "h" 3600000.0 }}
{{- $ms := 0.0 }}
{{- range regexFindAll "[0-9.]+[^0-9.]+" $d -1 }}
{{- $n := regexFind "^[0-9.]+" . }}
{{- $ms = addf $ms (mulf (float64 $n) (get $unit (trimPrefix $n .))) }}
{{- end }}
{{- $ms }}
{{- end }}

{{/*
Fails unless a duration lies within bounds, naming the value as the service
would: (list "gateway.heartbeatInterval" "1s" "100ms" "10s"); an empty
bound is open.
*/}}
{{- define "stillthere.checkDuration" -}}
{{- $where := index . 0 }}
{{- $d := index . 1 }}
{{- $min := index . 2 }}
{{- $max := index . 3 }}
{{- $ms := include "stillthere.milliseconds" (list $where $d) | float64 }}
{{- $low := and $min (lt $ms (include "stillthere.milliseconds" (list $where $min) | float64)) }}
{{- $high := and $max (gt $ms (include "stillthere.milliseconds" (list $where $max) | float64)) }}
{{- if and $min $max (or $low $high) }}
{{- fail (printf "%s: %v, want between %s and %s" $where $d $min $max) }}
{{- else if $low }}
{{- fail (printf "%s: %v, want at least %s" $where $d $min) }}
{{- else if $high }}
{{- fail (printf "%s: %v, want at most %s" $where $d $max) }}
{{- end }}
{{- end }}

{{/*
The value a service runs with for a setting the chart checks others
against: its own config map (by flag name or variable), else the typed
value, else the top-level config, else the service's default.
(list $ .Values.gateway "session-ttl" typedValue "60s")
*/}}
{{- define "stillthere.effectiveSetting" -}}
{{- $ := index . 0 }}
{{- $env := include "stillthere.envName" (index . 2) }}
{{- $out := "" }}
{{- range $k, $v := $.Values.config }}
{{- if eq (include "stillthere.envName" $k) $env }}{{ $out = $v }}{{ end }}
{{- end }}
{{- with index . 3 }}{{ $out = . }}{{ end }}
{{- range $k, $v := (index . 1).config }}
{{- if eq (include "stillthere.envName" $k) $env }}{{ $out = $v }}{{ end }}
{{- end }}
{{- /* not default: a setting given as the number 0 (prefetch-interval: off) is set */}}
{{- if and (kindIs "string" $out) (eq $out "") }}{{ $out = index . 4 }}{{ end }}
{{- include "stillthere.settingValue" $out }}
{{- end }}

{{/*
The listener's outage settings, which it takes only from typed values:
a copy in a config map would be shadowed by, or shadow, them.
*/}}
{{- define "stillthere.listenerOutageSettings" -}}
- outage-grace
- sweep-gap-max
- clock-jump-max
- mass-expiry-share
- mass-expiry-floor
- mass-expiry-window
- mass-expiry-release-rate
{{- end }}

{{/*
The settings of the timeout policy in force while none is stored, which
gateways and listeners both read: only from policy.*, so that the two
cannot differ.
*/}}
{{- define "stillthere.policySettings" -}}
- close-after
- close-text
{{- end }}

{{/*
The timeline settings every service reads: only from timeline.*, so that
no service trims the timelines shorter, or keeps them longer, than the
others.
*/}}
{{- define "stillthere.timelineSettings" -}}
- timeline-off
- timeline-entries
- timeline-keep
{{- end }}

{{/* timeline.* as ConfigMap data, checked as the services would at start. */}}
{{- define "stillthere.timelineData" -}}
{{- $t := .Values.timeline }}
{{- $entries := int64 $t.entries }}
{{- if or (lt $entries 1) (gt $entries 10000) }}
{{- fail (printf "timeline.entries: %v, want 1 to 10000" $t.entries) }}
{{- end }}
{{- include "stillthere.checkDuration" (list "timeline.keep" $t.keep "1m" "720h") }}
{{- toYaml (dict "timeline-off" (toString (not $t.enabled)) "timeline-entries" (toString $entries) "timeline-keep" $t.keep) }}
{{- end }}

{{/* Checks policy.* as the services would at start. */}}
{{- define "stillthere.checkPolicy" -}}
{{- $after := include "stillthere.settingValue" .Values.policy.closeAfter }}
{{- if $after }}
{{- $ms := include "stillthere.milliseconds" (list "policy.closeAfter" $after) | float64 }}
{{- if and (ne $ms 0.0) (or (lt $ms 1000.0) (gt $ms 86400000.0)) }}
{{- fail (printf "policy.closeAfter: %v, want 0 (no close stage) or between 1s and 24h" $after) }}
{{- end }}
{{- end }}
{{- if gt (len .Values.policy.closeText) 1024 }}
{{- fail (printf "policy.closeText: %d bytes, want at most 1024" (len .Values.policy.closeText)) }}
{{- end }}
{{- end }}

{{/*
Checks the listener's outage settings as it would at start, and that the
grace lets every client ping again after an outage: the gateway's TTL,
its jitter and 10s to reconnect; and, unless the gateway never sheds, its
shed-after and 10s to reconnect.
*/}}
{{- define "stillthere.checkOutage" -}}
{{- $l := .Values.listener }}
{{- include "stillthere.checkDuration" (list "listener.outageGrace" $l.outageGrace "1s" "24h") }}
{{- include "stillthere.checkDuration" (list "listener.clockJumpMax" $l.clockJumpMax "100ms" "") }}
{{- include "stillthere.checkDuration" (list "listener.massExpiry.window" $l.massExpiry.window "1s" "10m") }}
{{- $sweep := include "stillthere.effectiveSetting" (list . $l "sweep-interval" "" "200ms") }}
{{- $sweepMs := include "stillthere.milliseconds" (list "sweep-interval" $sweep) | float64 }}
{{- if lt (include "stillthere.milliseconds" (list "listener.sweepGapMax" $l.sweepGapMax) | float64) (mulf 2 $sweepMs) }}
{{- fail (printf "listener.sweepGapMax: %v, want at least twice sweep-interval (%v)" $l.sweepGapMax $sweep) }}
{{- end }}
{{- $prefetch := include "stillthere.effectiveSetting" (list . $l "prefetch-interval" "" "500ms") }}
{{- $prefetchMs := include "stillthere.milliseconds" (list "prefetch-interval" $prefetch) | float64 }}
{{- if and (gt $prefetchMs 0.0) (lt (include "stillthere.milliseconds" (list "listener.sweepGapMax" $l.sweepGapMax) | float64) (mulf 2 $prefetchMs)) }}
{{- fail (printf "listener.sweepGapMax: %v, want at least twice prefetch-interval (%v): each read-ahead marks the index swept; or set prefetch-interval to 0 (off)" $l.sweepGapMax $prefetch) }}
{{- end }}
{{- $ttl := include "stillthere.effectiveSetting" (list . .Values.gateway "session-ttl" .Values.gateway.sessionTTL "60s") }}
{{- $jitter := include "stillthere.effectiveSetting" (list . .Values.gateway "session-jitter" .Values.gateway.sessionJitter "5s") }}
{{- $need := addf (include "stillthere.milliseconds" (list "session-ttl" $ttl) | float64) (include "stillthere.milliseconds" (list "session-jitter" $jitter) | float64) 10000 }}
{{- if lt (include "stillthere.milliseconds" (list "listener.outageGrace" $l.outageGrace) | float64) $need }}
{{- fail (printf "listener.outageGrace: %v is shorter than the gateway's session-ttl %v + session-jitter %v + 10s to reconnect: after an outage, users would be timed out before they could ping again; raise it to at least %.0fs" $l.outageGrace $ttl $jitter (divf $need 1000)) }}
{{- end }}
{{- $shed := include "stillthere.settingValue" .Values.gateway.shedAfter }}
{{- $shedMs := include "stillthere.milliseconds" (list "gateway.shedAfter" $shed) | float64 }}
{{- $graceMs := include "stillthere.milliseconds" (list "listener.outageGrace" $l.outageGrace) | float64 }}
{{- if and (gt $shedMs 0.0) (ge (addf $shedMs 10000) $graceMs) }}
{{- fail (printf "gateway.shedAfter: %v + 10s to reconnect is not under listener.outageGrace %v: clients shed by a gateway cut off from Redis would reconnect only after the grace, and be timed out though they were there; raise listener.outageGrace above %gs, lower gateway.shedAfter below %gs, or set it to 0 to never shed" $shed $l.outageGrace (divf (addf $shedMs 10000) 1000) (divf (subf $graceMs 10000) 1000)) }}
{{- end }}
{{- end }}

{{/*
The gateway's activity feed settings, which it takes only from
gateway.activityFeed: a copy in a config map would shadow them, or turn
the feed on without the Kafka credentials and certificates it needs.
*/}}
{{- define "stillthere.activityFeedSettings" -}}
- activity-feed
- activity-topic
- activity-topic-partitions
- activity-topic-replication
- activity-group
- activity-dlq-topic
- activity-stamp
- activity-gap
- activity-group-session-timeout
{{- end }}

{{/*
The gateway's activity feed settings as ConfigMap data: off, only that;
on, every one, the dead-letter topic when given.
*/}}
{{- define "stillthere.activityFeedData" -}}
{{- $f := .Values.gateway.activityFeed }}
{{- $out := dict "activity-feed" (toString $f.enabled) }}
{{- if $f.enabled }}
{{- $out = merge $out (dict
  "activity-topic" $f.topic
  "activity-topic-partitions" $f.partitions
  "activity-topic-replication" $f.replication
  "activity-group" $f.group
  "activity-dlq-topic" $f.dlqTopic
  "activity-stamp" $f.stamp
  "activity-gap" $f.gap
  "activity-group-session-timeout" $f.groupSessionTimeout
) }}
{{- end }}
{{- toYaml $out }}
{{- end }}

{{/*
Checks gateway.activityFeed as the gateway would at start, and that its
topics and group are not the timeout pipeline's: gateways reading the
timeout topic would dead-letter its events, and gateways in the guide
consumers' group would rebalance them at every gateway start and stop.
*/}}
{{- define "stillthere.checkActivityFeed" -}}
{{- $f := .Values.gateway.activityFeed }}
{{- if $f.enabled }}
{{- include "stillthere.checkDuration" (list "gateway.activityFeed.stamp" $f.stamp "10ms" "10s") }}
{{- include "stillthere.checkDuration" (list "gateway.activityFeed.groupSessionTimeout" $f.groupSessionTimeout "6s" "30m") }}
{{- $stampMs := include "stillthere.milliseconds" (list "gateway.activityFeed.stamp" $f.stamp) | float64 }}
{{- if lt (include "stillthere.milliseconds" (list "gateway.activityFeed.gap" $f.gap) | float64) (mulf 4 $stampMs) }}
{{- fail (printf "gateway.activityFeed.gap: %v, want at least four stamps (gateway.activityFeed.stamp %v)" $f.gap $f.stamp) }}
{{- end }}
{{- $dlq := default (printf "%s-dlq" $f.topic) $f.dlqTopic }}
{{- if eq $dlq $f.topic }}
{{- fail (printf "gateway.activityFeed.dlqTopic: %q is the activity topic itself" $dlq) }}
{{- end }}
{{- $timeouts := .Values.kafka.topic }}
{{- $guideDLQ := include "stillthere.effectiveSetting" (list . .Values.consumer "dlq-topic" .Values.consumer.dlqTopic (printf "%s-dlq" $timeouts)) }}
{{- range list (list "gateway.activityFeed.topic" $f.topic) (list "gateway.activityFeed.dlqTopic" $dlq) }}
{{- $where := index . 0 }}
{{- $topic := index . 1 }}
{{- if has $topic (list $timeouts $guideDLQ) }}
{{- fail (printf "%s: %q is a topic of the timeout pipeline (kafka.topic %q, its dead-letter topic %q); want one of the activity feed's own" $where $topic $timeouts $guideDLQ) }}
{{- end }}
{{- end }}
{{- if eq $f.group .Values.consumer.group }}
{{- fail (printf "gateway.activityFeed.group: %q is consumer.group; want a group of the gateways' own: in one group, every gateway joining or leaving would rebalance the guide consumers" $f.group) }}
{{- end }}
{{- end }}
{{- end }}
