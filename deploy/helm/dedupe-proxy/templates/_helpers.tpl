{{/* The release's name for its resources, at most 63 characters. */}}
{{- define "dedupe-proxy.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "dedupe-proxy.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "dedupe-proxy.labels" -}}
{{ include "dedupe-proxy.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Whether the store is the embedded one (one replica, a volume claim). */}}
{{- define "dedupe-proxy.sled" -}}
{{- if not (has .Values.store.kind (list "sled" "redis" "postgres")) -}}
{{- fail (printf "store.kind is %q: one of sled, redis, postgres" .Values.store.kind) -}}
{{- end -}}
{{- if eq .Values.store.kind "sled" }}true{{ end -}}
{{- end -}}

{{/* The pod: the proxy's container, its configuration and probes. */}}
{{- define "dedupe-proxy.pod" -}}
metadata:
  labels:
    {{- include "dedupe-proxy.selectorLabels" . | nindent 4 }}
  annotations:
    # A change of the store rolls the pods (a reload cannot make it). With replicas, so
    # does a change of the routes: a configuration the new pods refuse stalls the rollout
    # (they never get ready) while the old ones serve. One sled replica reloads it in
    # place instead, keeping the running routes if it is refused.
    checksum/store: {{ toYaml .Values.store | sha256sum | trunc 16 }}
    {{- if not (include "dedupe-proxy.sled" .) }}
    checksum/config: {{ printf "%s%s%s" (toYaml .Values.routes) (toYaml .Values.defaults) .Values.upstream | sha256sum | trunc 16 }}
    {{- end }}
spec:
  terminationGracePeriodSeconds: {{ add .Values.shutdownGraceSeconds 15 }}
  # The proxy talks to no Kubernetes API.
  automountServiceAccountToken: false
  securityContext:
    runAsNonRoot: true
    fsGroup: 65532
    seccompProfile:
      type: RuntimeDefault
  containers:
    - name: dedupe-proxy
      image: "{{ .Values.image.repository }}:{{ .Values.image.tag }}"
      imagePullPolicy: {{ .Values.image.pullPolicy }}
      args: ["run", "--config", "/etc/dedupe-proxy/config.yaml", "--log-format", "json"]
      env:
        - name: RUST_LOG
          value: info
        - name: DEDUPE_PROXY_WORKERS
          value: {{ .Values.workers | quote }}
        - name: DEDUPE_ADMIN_TOKEN
          valueFrom:
            secretKeyRef:
              name: {{ .Values.secretName }}
              key: admin-token
        {{- if eq .Values.store.kind "redis" }}
        - name: REDIS_URL
          valueFrom:
            secretKeyRef:
              name: {{ .Values.secretName }}
              key: redis-url
        {{- end }}
        {{- if eq .Values.store.kind "postgres" }}
        - name: DATABASE_URL
          valueFrom:
            secretKeyRef:
              name: {{ .Values.secretName }}
              key: database-url
        {{- if .Values.store.postgres.directUrl }}
        - name: DATABASE_DIRECT_URL
          valueFrom:
            secretKeyRef:
              name: {{ .Values.secretName }}
              key: database-direct-url
        {{- end }}
        {{- end }}
      ports:
        - name: http
          containerPort: 8081
        - name: admin
          containerPort: 9091
      livenessProbe:
        httpGet:
          path: /healthz
          port: admin
        periodSeconds: 10
        failureThreshold: 3
      readinessProbe:
        httpGet:
          path: /readyz
          port: admin
        periodSeconds: 2
        failureThreshold: 1
      resources:
        {{- toYaml .Values.resources | nindent 8 }}
      securityContext:
        runAsNonRoot: true
        runAsUser: 65532
        runAsGroup: 65532
        readOnlyRootFilesystem: true
        allowPrivilegeEscalation: false
        capabilities:
          drop: ["ALL"]
      volumeMounts:
        - name: config
          mountPath: /etc/dedupe-proxy
          readOnly: true
        {{- if include "dedupe-proxy.sled" . }}
        - name: data
          mountPath: /data
        {{- end }}
  volumes:
    - name: config
      configMap:
        name: {{ include "dedupe-proxy.fullname" . }}
  {{- with .Values.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}
