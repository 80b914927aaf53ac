{{- /*
"installer.registry": prebuilt modules from a registry for the installer and the next-kernel
container (the patch of overlays/module-registry, from the values).
*/ -}}
{{- define "installer.registry.container" -}}
env:
  - name: NVIDIA_MODULE_REGISTRY
    value: {{ .Values.moduleRegistry.repository | quote }}
  - name: NVIDIA_MODULE_TRUSTED_KEYS
    value: /etc/nvidia-driver-installer/publisher/publisher.pub
  - name: NVIDIA_MODULE_REGISTRY_USERNAME
    valueFrom:
      secretKeyRef:
        name: {{ .Values.moduleRegistry.pullSecret | quote }}
        key: username
        optional: true
  - name: NVIDIA_MODULE_REGISTRY_PASSWORD_FILE
    value: /etc/nvidia-driver-installer/registry/password
volumeMounts:
  - name: module-publisher
    mountPath: /etc/nvidia-driver-installer/publisher
    readOnly: true
  - name: module-registry-pull
    mountPath: /etc/nvidia-driver-installer/registry
    readOnly: true
{{- end -}}
{{- define "installer.registry" -}}
spec:
  template:
    spec:
      volumes:
        - name: module-publisher
          configMap:
            name: {{ .Values.moduleRegistry.publisherConfigMap | quote }}
        - name: module-registry-pull
          secret:
            secretName: {{ .Values.moduleRegistry.pullSecret | quote }}
            optional: true
      initContainers:
        - name: nvidia-driver-installer
{{ include "installer.registry.container" . | indent 10 }}
      containers:
        - name: next-kernel
{{ include "installer.registry.container" . | indent 10 }}
{{- end -}}
