{{- /*
"installer.merge": a strategic merge of the patch `src` into `dst` (both maps; `dst` is
changed in place), as kustomize applies the components' patches: maps merge key by key; lists
of objects merge item by item on their merge key (mountPath for volumeMounts, else name), and
the patch's items, merged or new, come first in its order, the others after them (the order
kustomize's strategic merge leaves); anything else is replaced.
*/ -}}
{{- define "installer.merge" -}}
{{- $dst := .dst -}}
{{- range $key, $value := .src -}}
{{- $have := get $dst $key -}}
{{- if and (kindIs "map" $value) (kindIs "map" $have) -}}
{{- include "installer.merge" (dict "dst" $have "src" $value) -}}
{{- else if and (kindIs "slice" $value) (kindIs "slice" $have) $value (kindIs "map" (first $value)) -}}
{{- $mergeKey := ternary "mountPath" "name" (eq $key "volumeMounts") -}}
{{- $front := list -}}
{{- $patched := list -}}
{{- range $item := $value -}}
{{- $match := $item -}}
{{- range $existing := $have -}}
{{- if eq (get $existing $mergeKey) (get $item $mergeKey) -}}
{{- include "installer.merge" (dict "dst" $existing "src" $item) -}}
{{- $match = $existing -}}
{{- end -}}
{{- end -}}
{{- $front = append $front $match -}}
{{- $patched = append $patched (get $item $mergeKey) -}}
{{- end -}}
{{- $rest := list -}}
{{- range $existing := $have -}}
{{- if not (has (get $existing $mergeKey) $patched) -}}
{{- $rest = append $rest $existing -}}
{{- end -}}
{{- end -}}
{{- $_ := set $dst $key (concat $front $rest) -}}
{{- else -}}
{{- $_ := set $dst $key $value -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- /* "installer.patch": merge a kustomize patch file's DaemonSet into .ds. */ -}}
{{- define "installer.patch" -}}
{{- $patch := .files.Get .path | fromYaml -}}
{{- include "installer.merge" (dict "dst" .ds "src" (pick $patch "spec")) -}}
{{- end -}}

{{- /* "installer.files": a manifest file of base/ or components/, as it is. */ -}}
{{- define "installer.files" -}}
{{- range .paths }}
---
# Source: {{ . }}
{{ $.files.Get . }}
{{- end }}
{{- end -}}
