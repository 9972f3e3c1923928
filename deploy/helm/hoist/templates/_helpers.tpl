{{/* Names: release `hoist` gives `hoist`, release `x` gives `x-hoist`. */}}
{{- define "hoist.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end }}

{{- define "hoist.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end }}

{{- define "hoist.interceptorName" -}}
{{- printf "%s-interceptor" (include "hoist.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end }}

{{- define "hoist.proxyServiceName" -}}
{{- printf "%s-interceptor-proxy" (include "hoist.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end }}

{{- define "hoist.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "hoist.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end }}

{{/* Selector labels; call with (dict "ctx" $ "component" "scaler"|"interceptor"). */}}
{{- define "hoist.selectorLabels" -}}
app.kubernetes.io/name: {{ include "hoist.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "hoist.labels" -}}
{{ include "hoist.selectorLabels" . }}
app.kubernetes.io/part-of: hoist
app.kubernetes.io/version: {{ .ctx.Values.image.tag | default .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .ctx.Chart.Name .ctx.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "hoist.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* off | inProcess | split (YAML reads a bare `off` as false). */}}
{{- define "hoist.interceptorMode" -}}
{{- $mode := .Values.interceptor.mode | toString -}}
{{- if or (eq $mode "false") (eq $mode "") -}}off{{- else -}}{{ $mode }}{{- end -}}
{{- end }}

{{/* The port of a "host:port" listen address. */}}
{{- define "hoist.listenPort" -}}
{{- $parts := splitList ":" (toString .) -}}
{{- $port := last $parts -}}
{{- if not (regexMatch "^[0-9]+$" $port) -}}
{{- fail (printf "`%s` is not a host:port listen address" (toString .)) -}}
{{- end -}}
{{- $port -}}
{{- end }}

{{/*
The TCP ports the proxies listen on besides HTTP: each configured TCP
route's, then each of interceptor.declaredTcpPorts (routes ScaledObjects
declare with `listenPort`). One list for the pods, the proxy Service and
the NetworkPolicies, so a port hoist may open is one the Service reaches.
*/}}
{{- define "hoist.proxyTcpPorts" -}}
{{- $ports := list -}}
{{- range .Values.interceptor.tcpRoutes -}}
{{- $ports = append $ports (include "hoist.listenPort" .listen) -}}
{{- end -}}
{{- range .Values.interceptor.declaredTcpPorts -}}
{{- $ports = append $ports (toString (int .)) -}}
{{- end -}}
{{- toJson $ports -}}
{{- end }}

{{/* Container ports of the proxies: http, then one per TCP port. */}}
{{- define "hoist.proxyContainerPorts" -}}
- name: http
  containerPort: {{ .Values.interceptor.httpPort }}
{{- range include "hoist.proxyTcpPorts" . | fromJsonArray }}
- name: tcp-{{ . }}
  containerPort: {{ . }}
{{- end }}
{{- end }}

{{/*
interceptor.allowed_listen_ports, from interceptor.declaredTcpPorts: a
declared `listenPort` off the proxy Service would open a listener nobody
reaches, so hoist refuses it instead (naming the setting). None listed:
`{"*": []}`, no declared TCP route (hoist's own default, an empty table,
would allow any port from 1024).
*/}}
{{- define "hoist.allowedListenPorts" -}}
{{- range $where, $config := dict "config" .Values.config "interceptor.config" .Values.interceptor.config -}}
{{- if and $config (kindIs "map" $config.interceptor) (hasKey $config.interceptor "allowed_listen_ports") -}}
{{- fail (printf "%s.interceptor.allowed_listen_ports: list the ports in interceptor.declaredTcpPorts instead (the chart renders allowed_listen_ports from it, and puts each port on the proxy Service)" $where) -}}
{{- end -}}
{{- end -}}
{{- $ports := list -}}
{{- range .Values.interceptor.declaredTcpPorts -}}
{{- $ports = append $ports (toString (int .)) -}}
{{- end -}}
{{- toJson (dict "*" $ports) -}}
{{- end }}

{{/* The [interceptor] section of the process that runs the proxies. */}}
{{- define "hoist.proxySettings" -}}
{{- $routes := dict "http_listen" (printf "0.0.0.0:%v" .Values.interceptor.httpPort) -}}
{{- /* Runs even without configured routes: ScaledObjects declare theirs. */ -}}
{{- $_ := set $routes "enabled" true -}}
{{- $_ := set $routes "cold_start_timeout" .Values.interceptor.coldStartTimeout -}}
{{- $_ := set $routes "response_timeout" .Values.interceptor.responseTimeout -}}
{{- $_ := set $routes "max_held_per_route" .Values.interceptor.maxHeldPerRoute -}}
{{- $_ := set $routes "direct_to_pods" .Values.interceptor.directToPods -}}
{{- $_ := set $routes "allowed_listen_ports" (include "hoist.allowedListenPorts" . | fromJson) -}}
{{- if .Values.interceptor.httpRoutes }}{{ $_ := set $routes "http_routes" .Values.interceptor.httpRoutes }}{{ end -}}
{{- if .Values.interceptor.tcpRoutes }}{{ $_ := set $routes "tcp_routes" .Values.interceptor.tcpRoutes }}{{ end -}}
{{- toJson $routes -}}
{{- end }}

{{/*
Environment variable for auth param: AUTH_<PROFILE>_<PARAM>, upper case,
every character outside [A-Z0-9_] replaced by `_`. Call with (list profile param).
*/}}
{{- define "hoist.authEnvName" -}}
{{- regexReplaceAll "[^A-Z0-9_]" (printf "AUTH_%s_%s" (index . 0) (index . 1) | upper) "_" -}}
{{- end }}

{{/* The auth params kept in Secrets: a list of {name, profile, param, secretKeyRef}. */}}
{{- define "hoist.authSecretEnv" -}}
{{- $out := list -}}
{{- $seen := dict -}}
{{- range $profile, $params := .Values.auth -}}
{{- range $param, $value := omit $params "namespaces" -}}
{{- if kindIs "map" $value -}}
{{- if not $value.secretKeyRef -}}
{{- fail (printf "auth.%s.%s: give a string or secretKeyRef: {name, key}" $profile $param) -}}
{{- end -}}
{{- $name := include "hoist.authEnvName" (list $profile $param) -}}
{{- if hasKey $seen $name -}}
{{- fail (printf "auth.%s.%s and auth.%s both become %s: rename one" $profile $param (get $seen $name) $name) -}}
{{- end -}}
{{- $_ := set $seen $name (printf "%s.%s" $profile $param) -}}
{{- $out = append $out (dict "name" $name "secretKeyRef" $value.secretKeyRef) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toJson $out -}}
{{- end }}

{{/*
"true" when the split setup's channel is mTLS (interceptor.tls): both
Secrets or neither.
*/}}
{{- define "hoist.channelTLS" -}}
{{- $tls := .Values.interceptor.tls | default dict -}}
{{- if and (eq (include "hoist.interceptorMode" .) "split") (or $tls.serverSecretName $tls.clientSecretName) -}}
{{- if not (and $tls.serverSecretName $tls.clientSecretName) -}}
{{- fail "interceptor.tls: set both serverSecretName and clientSecretName (mTLS needs a certificate on each side), or neither" -}}
{{- end -}}
true
{{- end -}}
{{- end }}

{{/* Where a pod of the split setup finds its channel certificate. */}}
{{- define "hoist.channelTLSDir" -}}
/var/run/secrets/hoist-channel
{{- end }}

{{/* A volume of the channel Secret `secretName`. */}}
{{- define "hoist.channelTLSVolume" -}}
- name: channel-tls
  secret:
    secretName: {{ . }}
    items:
      - key: tls.crt
        path: tls.crt
      - key: tls.key
        path: tls.key
      - key: ca.crt
        path: ca.crt
{{- end }}

{{/*
A checksum of the settings hoist takes up only at start (hoist's
reload::RESTART_ONLY, which tests/helm.rs compares with this list): a
change of one of them rolls the pods; any other change of the config is
reloaded in place. Call with the rendered config, as a dict.
*/}}
{{- define "hoist.restartConfigChecksum" -}}
{{- $kept := pick . "grpc" "admin" "log" "state_file" "shutdown_grace" "shutdown" "kubernetes" -}}
{{- with .interceptor -}}
{{- $_ := set $kept "interceptor" (pick . "http_listen" "enabled" "endpoints" "scaler" "read_timeout" "tls") -}}
{{- end -}}
{{- /* It also sizes the gRPC decoder at start. */ -}}
{{- with .limits -}}
{{- $_ := set $kept "limits" (pick . "max_metadata_bytes") -}}
{{- end -}}
{{- toJson $kept | sha256sum -}}
{{- end }}

{{/*
In split mode without tls.admin.secretName, and interceptor.routeTableTLS
`generate`: the admin port serves the chart's own certificate (Secret
<fullname>-admin-tls, admin-tls-secret.yaml), so the interceptors can
check who serves them the route table. Sets tls.admin.secretName (and
the `_generated` mark) once; every template that reads tls.admin calls
it first.
*/}}
{{- define "hoist.adminTLSDefault" -}}
{{- $admin := .Values.tls.admin -}}
{{- if and (eq (include "hoist.interceptorMode" .) "split") (not $admin.secretName) -}}
{{- $choice := .Values.interceptor.routeTableTLS | default "generate" -}}
{{- if not (has $choice (list "generate" "none")) -}}
{{- fail (printf "interceptor.routeTableTLS is `%s`: use generate or none" $choice) -}}
{{- end -}}
{{- if eq $choice "generate" -}}
{{- $_ := set $admin "secretName" (printf "%s-admin-tls" (include "hoist.fullname" .)) -}}
{{- $_ := set $admin "_generated" true -}}
{{- end -}}
{{- end -}}
{{- end }}

{{/* Where an interceptor pod finds the CA of hoist's admin certificate. */}}
{{- define "hoist.scalerCADir" -}}
/var/run/secrets/hoist-admin-ca
{{- end }}

{{/*
How a split interceptor dials hoist's admin port to follow the route
table: over TLS when that port has it (tls.admin), checking its
certificate against the admin Secret's ca.crt for the name
<fullname>.<namespace>.svc, and presenting its channel certificate when
the port wants clients' (tls.admin.clientCA). A JSON dict; empty: plain.
*/}}
{{- define "hoist.followTLS" -}}
{{- include "hoist.adminTLSDefault" . -}}
{{- $admin := .Values.tls.admin -}}
{{- if $admin.secretName -}}
{{- $tls := dict
      "ca_file" (printf "%s/ca.crt" (include "hoist.scalerCADir" .))
      "server_name" (printf "%s.%s.svc" (include "hoist.fullname" .) .Release.Namespace) -}}
{{- if or $admin.clientCA.secretName $admin.clientCA.configMapName -}}
{{- if not (include "hoist.channelTLS" .) -}}
{{- fail "tls.admin.clientCA with interceptor.mode split: the interceptors follow the route table on hoist's admin port and need a client certificate there; set interceptor.tls (they present its server certificate, whose CA tls.admin.clientCA must hold)" -}}
{{- end -}}
{{- $dir := include "hoist.channelTLSDir" . -}}
{{- $_ := set $tls "cert_file" (printf "%s/tls.crt" $dir) -}}
{{- $_ := set $tls "key_file" (printf "%s/tls.key" $dir) -}}
{{- end -}}
{{- toJson $tls -}}
{{- else -}}
{}
{{- end -}}
{{- end }}

{{/* hoist.toml (the scaler's), as a dict encoded in JSON. */}}
{{- define "hoist.scalerConfig" -}}
{{- include "hoist.adminTLSDefault" . -}}
{{- $config := deepCopy (.Values.config | default dict) -}}
{{- /* A profile under `auth` replaces config's profile of that name whole. */ -}}
{{- if $config.auth -}}
{{- range $profile, $_ := .Values.auth -}}
{{- $_ := unset $config.auth $profile -}}
{{- end -}}
{{- end -}}
{{- /* The cluster's Services are *.svc.<clusterDomain>: the default sources say cluster.local. */ -}}
{{- if and (ne .Values.clusterDomain "cluster.local") $config.limits $config.limits.allowed_sources -}}
{{- $sources := list -}}
{{- range $config.limits.allowed_sources -}}
{{- $sources = append $sources (replace ".svc.cluster.local:" (printf ".svc.%s:" $.Values.clusterDomain) .) -}}
{{- end -}}
{{- $_ := set $config.limits "allowed_sources" $sources -}}
{{- end -}}
{{- $mode := include "hoist.interceptorMode" . -}}
{{- if and (eq $mode "inProcess") (not (hasKey $config "shutdown_grace")) -}}
{{- $_ := set $config "shutdown_grace" .Values.interceptor.shutdownGrace -}}
{{- end -}}
{{- $grpc := dict "listen" (printf "0.0.0.0:%v" .Values.ports.grpc) -}}
{{- $admin := dict "listen" (printf "0.0.0.0:%v" .Values.ports.admin) -}}
{{- range $listener, $target := dict "grpc" $grpc "admin" $admin -}}
{{- $tls := index $.Values.tls $listener -}}
{{- if $tls.secretName -}}
{{- $files := dict
      "cert_file" (printf "/var/run/secrets/hoist-tls/%s/tls.crt" $listener)
      "key_file" (printf "/var/run/secrets/hoist-tls/%s/tls.key" $listener) -}}
{{- if or $tls.clientCA.secretName $tls.clientCA.configMapName -}}
{{- $_ := set $files "client_ca_file" (printf "/var/run/secrets/hoist-tls/%s-client-ca/%s" $listener $tls.clientCA.key) -}}
{{- end -}}
{{- $_ := set $target "tls" $files -}}
{{- end -}}
{{- end -}}
{{- with include "hoist.adminAuth" . | fromJson -}}
{{- $_ := set $admin "auth" . -}}
{{- end -}}
{{- $generated := dict "grpc" $grpc "admin" $admin "shutdown" (dict "drain_delay" .Values.drainDelay) -}}
{{- if .Values.state.enabled -}}
{{- $_ := set $generated "state_file" (printf "%s/state.json" .Values.state.mountPath) -}}
{{- else -}}
{{- /* No volume: engine state in memory only, instead of hoist's default path on a read-only root (a warning every save). */ -}}
{{- $_ := set $generated "state_file" "" -}}
{{- end -}}
{{- $auth := dict -}}
{{- range $profile, $params := .Values.auth -}}
{{- $resolved := dict -}}
{{- if not (kindIs "slice" $params.namespaces) -}}
{{- fail (printf "auth.%s.namespaces: list the namespaces whose ScaledObjects may use the profile (e.g. [\"orders\"]; [\"*\"] for any)" $profile) -}}
{{- end -}}
{{- $_ := set $resolved "namespaces" $params.namespaces -}}
{{- range $param, $value := omit $params "namespaces" -}}
{{- if kindIs "map" $value -}}
{{- $_ := set $resolved $param (dict "env" (include "hoist.authEnvName" (list $profile $param))) -}}
{{- else -}}
{{- $_ := set $resolved $param (toString $value) -}}
{{- end -}}
{{- end -}}
{{- $_ := set $auth $profile $resolved -}}
{{- end -}}
{{- if $auth }}{{ $_ := set $generated "auth" $auth }}{{ end -}}
{{- if .Values.kubernetes.triggerAuthentication -}}
{{- $_ := set $generated "kubernetes" (dict
      "trigger_authentication" true
      "cluster_object_namespace" .Values.kubernetes.clusterObjectNamespace) -}}
{{- end -}}
{{- if eq $mode "inProcess" -}}
{{- $proxy := include "hoist.proxySettings" . | fromJson -}}
{{- if ne .Values.clusterDomain "cluster.local" -}}
{{- $_ := set $proxy "cluster_domain" .Values.clusterDomain -}}
{{- end -}}
{{- $_ := set $generated "interceptor" $proxy -}}
{{- else if eq $mode "split" -}}
{{- $endpoint := printf "%s.%s.svc.%s:%v" (include "hoist.interceptorName" .) .Release.Namespace .Values.clusterDomain .Values.ports.admin -}}
{{- /* The scaler decides which declared routes stand: it checks the ports too. */ -}}
{{- $section := dict "endpoints" (list $endpoint) "read_timeout" .Values.interceptor.readTimeout "allowed_listen_ports" (include "hoist.allowedListenPorts" . | fromJson) -}}
{{- if ne .Values.clusterDomain "cluster.local" -}}
{{- $_ := set $section "cluster_domain" .Values.clusterDomain -}}
{{- end -}}
{{- if include "hoist.channelTLS" . -}}
{{- $dir := include "hoist.channelTLSDir" . -}}
{{- $_ := set $section "tls" (dict
      "ca_file" (printf "%s/ca.crt" $dir)
      "cert_file" (printf "%s/tls.crt" $dir)
      "key_file" (printf "%s/tls.key" $dir)
      "server_name" (printf "%s.%s.svc" (include "hoist.interceptorName" .) .Release.Namespace)) -}}
{{- end -}}
{{- $_ := set $generated "interceptor" $section -}}
{{- end -}}
{{- toJson (mustMergeOverwrite $config $generated) -}}
{{- end }}

{{/* interceptor.toml (split mode), as a dict encoded in JSON. */}}
{{- define "hoist.interceptorConfig" -}}
{{- $config := deepCopy (.Values.interceptor.config | default dict) -}}
{{- if not (hasKey $config "shutdown_grace") -}}
{{- $_ := set $config "shutdown_grace" .Values.interceptor.shutdownGrace -}}
{{- end -}}
{{- $admin := dict "listen" (printf "0.0.0.0:%v" .Values.ports.admin) -}}
{{- if include "hoist.channelTLS" . -}}
{{- $dir := include "hoist.channelTLSDir" . -}}
{{- $_ := set $admin "tls" (dict
      "cert_file" (printf "%s/tls.crt" $dir)
      "key_file" (printf "%s/tls.key" $dir)
      "client_ca_file" (printf "%s/ca.crt" $dir)) -}}
{{- end -}}
{{- with include "hoist.adminAuth" . | fromJson -}}
{{- $_ := set $admin "auth" . -}}
{{- end -}}
{{- $proxy := include "hoist.proxySettings" . | fromJson -}}
{{- /* Follows the routes ScaledObjects declare, from the scaler's admin port. */ -}}
{{- $_ := set $proxy "scaler" (printf "%s.%s.svc.%s:%v" (include "hoist.fullname" .) .Release.Namespace .Values.clusterDomain .Values.ports.admin) -}}
{{- if ne .Values.clusterDomain "cluster.local" -}}
{{- $_ := set $proxy "cluster_domain" .Values.clusterDomain -}}
{{- end -}}
{{- with include "hoist.followTLS" . | fromJson -}}
{{- $_ := set $proxy "tls" . -}}
{{- end -}}
{{- $generated := dict
      "shutdown" (dict "drain_delay" .Values.drainDelay)
      "admin" $admin
      "interceptor" $proxy -}}
{{- toJson (mustMergeOverwrite $config $generated) -}}
{{- end }}

{{/*
TOML from a dict: a table's plain keys first (strings, numbers, bools and
lists of them, written as JSON, which is valid TOML for these; a
{env = ...} or {file = ...} map inline), then its sub-tables, then its
arrays of tables. Whole numbers print without a fraction (Helm reads
every YAML number as a float). Null values are left out. A table with
no plain keys gets no header of its own.
*/}}
{{- define "hoist.toml" -}}
{{- include "hoist.toml.table" (dict "path" "" "table" . "array" false) | trim -}}
{{- end }}

{{- define "hoist.toml.key" -}}
{{- if regexMatch "^[A-Za-z0-9_-]+$" . }}{{ . }}{{ else }}{{ toJson . }}{{ end -}}
{{- end }}

{{/* What a value is: inline, table, tables (array of), skip, or plain. */}}
{{- define "hoist.toml.kind" -}}
{{- if kindIs "invalid" . -}}skip
{{- else if kindIs "map" . -}}
{{- if and (eq (len .) 1) (or (hasKey . "env") (hasKey . "file")) -}}inline
{{- else if . -}}table
{{- else -}}skip
{{- end -}}
{{- else if and (kindIs "slice" .) . (kindIs "map" (first .)) -}}tables
{{- else -}}plain
{{- end -}}
{{- end }}

{{- define "hoist.toml.table" -}}
{{- $path := .path -}}
{{- $plain := list -}}
{{- range $key, $value := .table -}}
{{- if has (include "hoist.toml.kind" $value) (list "plain" "inline") }}{{ $plain = append $plain $key }}{{ end -}}
{{- end -}}
{{- if .array }}

[[{{ $path }}]]
{{- else if and $path $plain }}

[{{ $path }}]
{{- end -}}
{{- range $key := $plain -}}
{{- $value := index $.table $key -}}
{{- $kind := include "hoist.toml.kind" $value -}}
{{- if eq $kind "inline" }}
{{ include "hoist.toml.key" $key }} = { {{ keys $value | first }} = {{ values $value | first | toJson }} }
{{- else if and (kindIs "float64" $value) (eq $value (floor $value)) }}
{{ include "hoist.toml.key" $key }} = {{ int64 $value }}
{{- else }}
{{ include "hoist.toml.key" $key }} = {{ toJson $value }}
{{- end -}}
{{- end -}}
{{- range $key, $value := .table -}}
{{- $full := ternary (include "hoist.toml.key" $key) (printf "%s.%s" $path (include "hoist.toml.key" $key)) (eq $path "") -}}
{{- $kind := include "hoist.toml.kind" $value -}}
{{- if eq $kind "table" -}}
{{- include "hoist.toml.table" (dict "path" $full "table" $value "array" false) -}}
{{- else if eq $kind "tables" -}}
{{- range $value -}}
{{- include "hoist.toml.table" (dict "path" $full "table" . "array" true) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end }}

{{/*
Ports of one process's listeners must differ: two on one number crash-loop
it on `Address already in use`. Call with (list context "where" ports...).
*/}}
{{- define "hoist.distinctPorts" -}}
{{- $where := index . 1 -}}
{{- $seen := dict -}}
{{- range (slice . 2) -}}
{{- $port := toString . -}}
{{- if hasKey $seen $port -}}
{{- fail (printf "%s: port %s is used twice (ports.grpc, ports.admin, interceptor.httpPort, each TCP route's listen port and interceptor.declaredTcpPorts must differ)" $where $port) -}}
{{- end -}}
{{- $_ := set $seen $port true -}}
{{- end -}}
{{- end }}

{{/* The ports the proxies listen on: HTTP, then each TCP port. */}}
{{- define "hoist.proxyPorts" -}}
{{- toJson (prepend (include "hoist.proxyTcpPorts" . | fromJsonArray) .Values.interceptor.httpPort) -}}
{{- end }}

{{/* The ServiceAccount the split interceptors run as. */}}
{{- define "hoist.interceptorServiceAccountName" -}}
{{- .Values.serviceAccount.create | ternary (include "hoist.interceptorName" .) (include "hoist.serviceAccountName" .) -}}
{{- end }}

{{/* Where a pod finds its projected token for hoist's admin ports. */}}
{{- define "hoist.adminTokenDir" -}}
/var/run/secrets/hoist-admin-token
{{- end }}

{{/*
[admin.auth] of both processes (adminAuth), as a JSON dict; empty when
adminAuth is off (hoist's default then: the reports want a client
certificate, or answer nobody, on an address other than loopback).
Callers: hoist's and the interceptors' ServiceAccounts, and
adminAuth.allowedCallers; each pod presents its own projected token for
adminAuth.audience (useless to anyone replaying it to the API server).
*/}}
{{- define "hoist.adminAuth" -}}
{{- $auth := .Values.adminAuth -}}
{{- if $auth.enabled -}}
{{- $callers := list
      (printf "system:serviceaccount:%s:%s" .Release.Namespace (include "hoist.serviceAccountName" .))
      (printf "system:serviceaccount:%s:%s" .Release.Namespace (include "hoist.interceptorServiceAccountName" .)) -}}
{{- $callers = concat $callers ($auth.allowedCallers | default list) | uniq -}}
{{- toJson (dict
      "require" "always"
      "allowed_callers" $callers
      "audiences" (list $auth.audience)
      "cache_ttl" $auth.cacheTTL
      "token_file" (printf "%s/token" (include "hoist.adminTokenDir" .))) -}}
{{- else -}}
{}
{{- end -}}
{{- end }}

{{/* The projected token volume adminAuth mounts in both pods. */}}
{{- define "hoist.adminTokenVolume" -}}
- name: admin-token
  projected:
    sources:
      - serviceAccountToken:
          audience: {{ .Values.adminAuth.audience }}
          expirationSeconds: {{ .Values.adminAuth.tokenExpirationSeconds }}
          path: token
{{- end }}
