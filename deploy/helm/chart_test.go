package helm

import (
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

const fullname = release + "-stillthere"

// component names, as in app.kubernetes.io/component, and the binary each
// Deployment runs.
var components = []string{"gateway", "expiry-listener", "guide-consumer"}

// values are the few chart values the assertions compare against, read
// from values.yaml with a values file on top.
type values struct {
	Secrets struct {
		ExistingSecret string `json:"existingSecret"`
		ActivitySecret string `json:"activitySecret"`
		OpsSecret      string `json:"opsSecret"`
		NotifySecret   string `json:"notifySecret"`
	} `json:"secrets"`
	Timeline timelineValues `json:"timeline"`
	Kafka    struct {
		Partitions int `json:"partitions"`
	} `json:"kafka"`
	Consumer struct {
		Pprof     bool   `json:"pprof"`
		Sender    string `json:"sender"`
		NotifyURL string `json:"notifyURL"`
		Keda      struct {
			LagThreshold int `json:"lagThreshold"`
		} `json:"keda"`
	} `json:"consumer"`
	NetworkPolicy struct {
		MetricsFrom  []networkingv1.NetworkPolicyPeer `json:"metricsFrom"`
		ActivityFrom []networkingv1.NetworkPolicyPeer `json:"activityFrom"`
	} `json:"networkPolicy"`
	Gateway struct {
		Pprof             bool         `json:"pprof"`
		HeartbeatInterval string       `json:"heartbeatInterval"`
		ShedAfter         string       `json:"shedAfter"`
		ActivityFeed      activityFeed `json:"activityFeed"`
	} `json:"gateway"`
	Listener struct {
		Pprof        bool   `json:"pprof"`
		OutageGrace  string `json:"outageGrace"`
		SweepGapMax  string `json:"sweepGapMax"`
		ClockJumpMax string `json:"clockJumpMax"`
		MassExpiry   struct {
			Share       float64 `json:"share"`
			Floor       int     `json:"floor"`
			Window      string  `json:"window"`
			ReleaseRate int     `json:"releaseRate"`
		} `json:"massExpiry"`
	} `json:"listener"`
	Canary         canaryValues `json:"canary"`
	PrometheusRule struct {
		Enabled     bool              `json:"enabled"`
		Labels      map[string]string `json:"labels"`
		Matchers    string            `json:"matchers"`
		AlertLabels map[string]string `json:"alertLabels"`
	} `json:"prometheusRule"`
}

func loadValues(t *testing.T, files ...string) values {
	t.Helper()
	var v values
	for _, f := range append([]string{chartDir + "/values.yaml"}, files...) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(b, &v); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
	}
	return v
}

// valueSets are the values files the chart is rendered with, as
// deploy/helm/check.sh renders it: ci/*-values.yaml, the defaults with an
// existing Secret (the defaults alone supply no secret) and every
// optional feature on.
func valueSets(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(chartDir + "/ci/*-values.yaml")
	if err != nil || len(files) < 2 {
		t.Fatalf("values files in %s/ci: %q, %v", chartDir, files, err)
	}
	return files
}

func TestChart(t *testing.T) {
	for _, file := range valueSets(t) {
		t.Run(filepath.Base(file), func(t *testing.T) {
			out, err := render(t, "-f", file)
			if err != nil {
				t.Fatal(err)
			}
			m, err := decode(out)
			if err != nil {
				t.Fatalf("decoding the rendered chart strictly:\n%v", err)
			}
			checkChart(t, m, loadValues(t, file))
		})
	}
}

// checkChart asserts the invariants on one rendering.
func checkChart(t *testing.T, m *manifests, v values) {
	pods := map[string]*corev1.PodTemplateSpec{}
	for _, c := range components {
		name := fullname + "-" + c
		switch {
		case m.deployments[name] != nil:
			pods[c] = &m.deployments[name].Spec.Template
		case m.statefulSets[name] != nil:
			pods[c] = &m.statefulSets[name].Spec.Template
		default:
			t.Fatalf("no Deployment or StatefulSet %s", name)
		}
	}
	for _, c := range components {
		t.Run(c, func(t *testing.T) {
			checkPod(t, m, c, pods[c])
			checkPDB(t, m, c, pods[c])
		})
	}
	t.Run("gateway drain", func(t *testing.T) { checkGatewayDrain(t, m, pods["gateway"]) })
	t.Run("listener spool", func(t *testing.T) { checkSpool(t, m, pods["expiry-listener"]) })
	t.Run("services", func(t *testing.T) { checkServices(t, m, pods) })
	t.Run("push port network policy", func(t *testing.T) { checkPushPolicy(t, m, pods, v) })
	t.Run("autoscaling", func(t *testing.T) { checkAutoscaling(t, m, pods, v) })
	t.Run("service monitor", func(t *testing.T) { checkServiceMonitor(t, m) })
	t.Run("outage settings", func(t *testing.T) { checkOutage(t, m, pods, v) })
	t.Run("prometheus rule", func(t *testing.T) { checkPrometheusRule(t, m, v) })
	t.Run("canary", func(t *testing.T) { checkCanary(t, m, v) })
	t.Run("secrets", func(t *testing.T) { checkSecrets(t, m, pods, v) })
	t.Run("activity feed", func(t *testing.T) { checkActivityFeed(t, m, pods, v.Gateway.ActivityFeed) })
	t.Run("timeline", func(t *testing.T) { checkTimeline(t, m, pods, v.Timeline) })
	t.Run("notify webhook", func(t *testing.T) { checkNotify(t, m, pods, notifyWant(v)) })
	t.Run("pprof", func(t *testing.T) {
		for c, on := range map[string]bool{"gateway": v.Gateway.Pprof, "expiry-listener": v.Listener.Pprof, "guide-consumer": v.Consumer.Pprof} {
			if got, want := setting(t, env(t, m, &pods[c].Spec.Containers[0]), "STILLTHERE_PPROF"), strconv.FormatBool(on); got != want {
				t.Errorf("%s: STILLTHERE_PPROF = %q, want %q from the values", c, got, want)
			}
		}
	})
	t.Run("secrets stay out of config maps", func(t *testing.T) {
		for name, cm := range m.configMaps {
			for k := range cm.Data {
				if strings.HasSuffix(k, "_SECRET") || strings.HasSuffix(k, "_PASSWORD") {
					t.Errorf("ConfigMap %s holds %s", name, k)
				}
			}
		}
	})
}

// env resolves a container's environment as the kubelet would: envFrom
// ConfigMaps in order, then env. A value from a Secret reads "secret:name/key".
func env(t *testing.T, m *manifests, ctr *corev1.Container) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, from := range ctr.EnvFrom {
		if from.ConfigMapRef == nil {
			t.Fatalf("container %s: envFrom other than a ConfigMap", ctr.Name)
		}
		cm := m.configMaps[from.ConfigMapRef.Name]
		if cm == nil {
			t.Fatalf("container %s: envFrom ConfigMap %s is not rendered", ctr.Name, from.ConfigMapRef.Name)
		}
		maps.Copy(out, cm.Data)
	}
	for _, e := range ctr.Env {
		switch {
		case e.ValueFrom == nil:
			out[e.Name] = e.Value
		case e.ValueFrom.SecretKeyRef != nil:
			ref := e.ValueFrom.SecretKeyRef
			if s := m.secrets[ref.Name]; s != nil {
				if _, ok := s.Data[ref.Key]; !ok {
					t.Errorf("container %s: %s refers to key %q that Secret %s does not hold", ctr.Name, e.Name, ref.Key, ref.Name)
				}
			} else if strings.HasPrefix(ref.Name, fullname) {
				t.Errorf("container %s: %s refers to Secret %s, which is not rendered", ctr.Name, e.Name, ref.Name)
			}
			out[e.Name] = "secret:" + ref.Name + "/" + ref.Key
		default:
			t.Errorf("container %s: %s from neither a value nor a Secret", ctr.Name, e.Name)
		}
	}
	return out
}

func setting(t *testing.T, envs map[string]string, name string) string {
	t.Helper()
	v, ok := envs[name]
	if !ok || v == "" {
		t.Fatalf("%s is not set", name)
	}
	return v
}

func duration(t *testing.T, envs map[string]string, name string) time.Duration {
	t.Helper()
	d, err := time.ParseDuration(setting(t, envs, name))
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return d
}

// listenPort is the port of a listen address setting such as ":8081".
func listenPort(t *testing.T, envs map[string]string, name string) int32 {
	t.Helper()
	_, p, err := net.SplitHostPort(setting(t, envs, name))
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return int32(n)
}

// adminAddr is the setting of each component's internal listener.
var adminAddr = map[string]string{
	"gateway":         "STILLTHERE_PUSH_ADDR",
	"expiry-listener": "STILLTHERE_LISTENER_ADMIN_ADDR",
	"guide-consumer":  "STILLTHERE_CONSUMER_ADMIN_ADDR",
	"canary":          "STILLTHERE_CANARY_ADMIN_ADDR",
}

func containerPort(ctr *corev1.Container, name string) (int32, bool) {
	for _, p := range ctr.Ports {
		if p.Name == name {
			return p.ContainerPort, true
		}
	}
	return 0, false
}

func checkPod(t *testing.T, m *manifests, component string, pod *corev1.PodTemplateSpec) {
	spec := pod.Spec
	if got := pod.Labels["app.kubernetes.io/component"]; got != component {
		t.Errorf("pod label component = %q", got)
	}
	if len(spec.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(spec.Containers))
	}
	ctr := &spec.Containers[0]
	want := []string{"/usr/local/bin/" + component}
	if component == "canary" {
		want = []string{"/usr/local/bin/gateway", "canary"}
	}
	if !slices.Equal(ctr.Command, want) {
		t.Errorf("command = %q, want %q", ctr.Command, want)
	}
	envs := env(t, m, ctr)

	// Probes on the port the service's internal listener binds.
	internal, ok := containerPort(ctr, "internal")
	if !ok {
		t.Fatal("no container port named internal")
	}
	if bound := listenPort(t, envs, adminAddr[component]); bound != internal {
		t.Errorf("%s binds port %d, the container port internal is %d", adminAddr[component], bound, internal)
	}
	for _, p := range []struct {
		name  string
		probe *corev1.Probe
		path  string
	}{{"liveness", ctr.LivenessProbe, "/healthz"}, {"readiness", ctr.ReadinessProbe, "/readyz"}} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			t.Errorf("no HTTP %s probe", p.name)
			continue
		}
		g := p.probe.HTTPGet
		if g.Path != p.path || g.Port != intstr.FromString("internal") {
			t.Errorf("%s probe on %s port %s, want %s on internal", p.name, g.Path, g.Port.String(), p.path)
		}
	}

	// Resources: requests for scheduling, a memory limit.
	for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if q, ok := ctr.Resources.Requests[r]; !ok || q.IsZero() {
			t.Errorf("no %s request", r)
		}
	}
	if q, ok := ctr.Resources.Limits[corev1.ResourceMemory]; !ok || q.IsZero() {
		t.Error("no memory limit")
	}

	// Restricted security context.
	psc := spec.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser == 0 {
		t.Errorf("pod securityContext does not run as non-root: %+v", psc)
	}
	if psc == nil || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Error("pod seccompProfile is not RuntimeDefault")
	}
	sc := ctr.SecurityContext
	switch {
	case sc == nil:
		t.Fatal("no container securityContext")
	case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
		t.Error("allowPrivilegeEscalation is not false")
	case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
		t.Error("readOnlyRootFilesystem is not true")
	case sc.Privileged != nil && *sc.Privileged:
		t.Error("privileged")
	case sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || len(sc.Capabilities.Add) > 0:
		t.Errorf("capabilities = %+v, want ALL dropped and none added", sc.Capabilities)
	case sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot:
		t.Error("container runAsNonRoot is not true")
	}
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		t.Error("the pod mounts a service account token it never uses")
	}

	// A writable /tmp on the read-only root filesystem.
	if v := mountedVolume(spec, ctr, "/tmp"); v == nil || v.EmptyDir == nil {
		t.Error("/tmp is not an emptyDir")
	}
	// Volumes from ConfigMaps are rendered.
	for _, vol := range spec.Volumes {
		if vol.ConfigMap != nil && m.configMaps[vol.ConfigMap.Name] == nil {
			t.Errorf("volume %s: ConfigMap %s is not rendered", vol.Name, vol.ConfigMap.Name)
		}
	}
	if spec.ServiceAccountName != "" && m.accounts[spec.ServiceAccountName] == nil {
		t.Errorf("ServiceAccount %s is not rendered", spec.ServiceAccountName)
	}
}

// mountedVolume is the volume mounted at path, or nil.
func mountedVolume(spec corev1.PodSpec, ctr *corev1.Container, path string) *corev1.Volume {
	for _, vm := range ctr.VolumeMounts {
		if vm.MountPath == path {
			for i := range spec.Volumes {
				if spec.Volumes[i].Name == vm.Name {
					return &spec.Volumes[i]
				}
			}
		}
	}
	return nil
}

func checkPDB(t *testing.T, m *manifests, component string, pod *corev1.PodTemplateSpec) {
	pdb := m.pdbs[fullname+"-"+component]
	if pdb == nil {
		t.Fatal("no PodDisruptionBudget")
	}
	if !selects(t, pdb.Spec.Selector, pod.Labels) {
		t.Error("the PodDisruptionBudget does not select the pods")
	}
	if pdb.Spec.MaxUnavailable == nil && pdb.Spec.MinAvailable == nil {
		t.Error("the PodDisruptionBudget bounds nothing")
	}
}

func selects(t *testing.T, ls *metav1.LabelSelector, podLabels map[string]string) bool {
	t.Helper()
	sel, err := metav1.LabelSelectorAsSelector(ls)
	if err != nil {
		t.Fatal(err)
	}
	return !sel.Empty() && sel.Matches(labels.Set(podLabels))
}

// checkGatewayDrain: the kubelet must not kill a gateway still draining.
// Its grace period must exceed the preStop pause plus the shutdown-timeout
// the gateway is configured with.
func checkGatewayDrain(t *testing.T, m *manifests, pod *corev1.PodTemplateSpec) {
	ctr := &pod.Spec.Containers[0]
	drain := duration(t, env(t, m, ctr), "STILLTHERE_SHUTDOWN_TIMEOUT")
	var preStop time.Duration
	if ctr.Lifecycle != nil && ctr.Lifecycle.PreStop != nil {
		if ctr.Lifecycle.PreStop.Sleep == nil {
			t.Fatal("the preStop hook is not a sleep action (the image has no shell)")
		}
		preStop = time.Duration(ctr.Lifecycle.PreStop.Sleep.Seconds) * time.Second
	}
	if pod.Spec.TerminationGracePeriodSeconds == nil {
		t.Fatal("no terminationGracePeriodSeconds")
	}
	grace := time.Duration(*pod.Spec.TerminationGracePeriodSeconds) * time.Second
	if grace <= preStop+drain {
		t.Errorf("terminationGracePeriodSeconds %v does not exceed preStop %v + shutdown-timeout %v", grace, preStop, drain)
	}
	// The listener and consumer finish work bounded by a timeout too.
	for c, setting := range map[string]string{"expiry-listener": "STILLTHERE_PRODUCE_TIMEOUT", "guide-consumer": "STILLTHERE_SEND_TIMEOUT"} {
		var tmpl *corev1.PodTemplateSpec
		if d := m.deployments[fullname+"-"+c]; d != nil {
			tmpl = &d.Spec.Template
		} else {
			tmpl = &m.statefulSets[fullname+"-"+c].Spec.Template
		}
		bound := duration(t, env(t, m, &tmpl.Spec.Containers[0]), setting)
		if g := tmpl.Spec.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second <= bound {
			t.Errorf("%s: terminationGracePeriodSeconds does not exceed %s %v", c, setting, bound)
		}
	}
}

// checkSpool: the listener's spool directory is a volume, an emptyDir
// larger than the spool's cap or a per-replica claim.
func checkSpool(t *testing.T, m *manifests, pod *corev1.PodTemplateSpec) {
	ctr := &pod.Spec.Containers[0]
	envs := env(t, m, ctr)
	dir := setting(t, envs, "STILLTHERE_SPOOL_DIR")
	maxBytes, err := strconv.ParseInt(setting(t, envs, "STILLTHERE_SPOOL_MAX_BYTES"), 10, 64)
	if err != nil {
		t.Fatalf("STILLTHERE_SPOOL_MAX_BYTES: %v", err)
	}
	var mount *corev1.VolumeMount
	for i := range ctr.VolumeMounts {
		if ctr.VolumeMounts[i].MountPath == dir {
			mount = &ctr.VolumeMounts[i]
		}
	}
	if mount == nil {
		t.Fatalf("nothing is mounted at the spool directory %s", dir)
	}
	if mount.ReadOnly {
		t.Error("the spool is mounted read-only")
	}
	if vol := mountedVolume(pod.Spec, ctr, dir); vol != nil {
		if vol.EmptyDir == nil || vol.EmptyDir.SizeLimit == nil {
			t.Fatalf("spool volume %s is not a sized emptyDir", vol.Name)
		}
		if vol.EmptyDir.SizeLimit.Cmp(*resource.NewQuantity(maxBytes, resource.BinarySI)) <= 0 {
			t.Errorf("spool emptyDir sizeLimit %s does not exceed spool-max-bytes %d: the kubelet would evict before the cap", vol.EmptyDir.SizeLimit, maxBytes)
		}
		return
	}
	sts := m.statefulSets[fullname+"-expiry-listener"]
	if sts == nil {
		t.Fatalf("spool mount %s has neither a volume nor a claim template", mount.Name)
	}
	for _, pvc := range sts.Spec.VolumeClaimTemplates {
		if pvc.Name == mount.Name {
			if sts.Spec.PersistentVolumeClaimRetentionPolicy == nil ||
				sts.Spec.PersistentVolumeClaimRetentionPolicy.WhenScaled != appsv1.RetainPersistentVolumeClaimRetentionPolicyType {
				t.Error("the spool claims are not retained on scale-down: spooled events would be lost")
			}
			return
		}
	}
	t.Fatalf("spool mount %s has no claim template", mount.Name)
}

func checkServices(t *testing.T, m *manifests, pods map[string]*corev1.PodTemplateSpec) {
	gwEnv := env(t, m, &pods["gateway"].Spec.Containers[0])
	for _, s := range []struct {
		service, component, targetPort, bindSetting string
	}{
		{fullname + "-gateway", "gateway", "ws", "STILLTHERE_GATEWAY_ADDR"},
		{fullname + "-gateway-internal", "gateway", "internal", "STILLTHERE_PUSH_ADDR"},
		{fullname + "-expiry-listener", "expiry-listener", "internal", ""},
		{fullname + "-guide-consumer", "guide-consumer", "internal", ""},
	} {
		svc := m.services[s.service]
		if svc == nil {
			t.Errorf("no Service %s", s.service)
			continue
		}
		pod := pods[s.component]
		if !selects(t, &metav1.LabelSelector{MatchLabels: svc.Spec.Selector}, pod.Labels) {
			t.Errorf("Service %s does not select the %s pods", s.service, s.component)
		}
		if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].TargetPort != intstr.FromString(s.targetPort) {
			t.Errorf("Service %s ports = %+v, want one to %s", s.service, svc.Spec.Ports, s.targetPort)
		}
		if s.bindSetting != "" {
			port, _ := containerPort(&pod.Spec.Containers[0], s.targetPort)
			if bound := listenPort(t, gwEnv, s.bindSetting); bound != port {
				t.Errorf("%s binds %d, the container port %s is %d", s.bindSetting, bound, s.targetPort, port)
			}
		}
	}
	if svc := m.services[fullname+"-gateway-internal"]; svc != nil && svc.Spec.Type != corev1.ServiceTypeClusterIP {
		t.Errorf("the push port's Service is %s, want ClusterIP", svc.Spec.Type)
	}
	// The consumer pushes to that Service.
	consumerEnv := env(t, m, &pods["guide-consumer"].Spec.Containers[0])
	if consumerEnv["STILLTHERE_SENDER"] != "webhook" {
		want := fmt.Sprintf("http://%s-gateway-internal.%s.svc:%d/v1/push", fullname, namespace, listenPort(t, gwEnv, "STILLTHERE_PUSH_ADDR"))
		if got := consumerEnv["STILLTHERE_PUSH_URL"]; got != want {
			t.Errorf("STILLTHERE_PUSH_URL = %q, want %q", got, want)
		}
	}
}

// checkPushPolicy: a NetworkPolicy lets only guide-consumer pods (and the
// configured metrics scrapers and activity peers) reach the gateway's
// internal port.
func checkPushPolicy(t *testing.T, m *manifests, pods map[string]*corev1.PodTemplateSpec, v values) {
	gw := pods["gateway"]
	pushPort, _ := containerPort(&gw.Spec.Containers[0], "internal")
	var policies []*networkingv1.NetworkPolicy
	for _, np := range m.netpols {
		if selects(t, &np.Spec.PodSelector, gw.Labels) {
			policies = append(policies, np)
		}
	}
	if len(policies) != 1 {
		t.Fatalf("%d NetworkPolicies select the gateway pods, want 1", len(policies))
	}
	np := policies[0]
	if !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) {
		t.Fatal("the gateway's NetworkPolicy does not restrict ingress")
	}
	coversPush := func(ports []networkingv1.NetworkPolicyPort) bool {
		if len(ports) == 0 {
			return true // every port
		}
		for _, p := range ports {
			if p.Port == nil || *p.Port == intstr.FromString("internal") || *p.Port == intstr.FromInt32(pushPort) {
				return true
			}
		}
		return false
	}
	consumerAllowed := false
	for i, rule := range np.Spec.Ingress {
		if !coversPush(rule.Ports) {
			continue
		}
		if len(rule.From) == 0 {
			t.Errorf("ingress rule %d opens the push port to everyone", i)
		}
		for _, peer := range rule.From {
			configured := slices.Concat(v.NetworkPolicy.MetricsFrom, v.NetworkPolicy.ActivityFrom)
			if slices.ContainsFunc(configured, func(p networkingv1.NetworkPolicyPeer) bool { return reflect.DeepEqual(p, peer) }) {
				continue
			}
			if peer.PodSelector == nil || peer.NamespaceSelector != nil || peer.IPBlock != nil {
				t.Errorf("ingress rule %d lets %+v reach the push port", i, peer)
				continue
			}
			for _, c := range components {
				matches := selects(t, peer.PodSelector, pods[c].Labels)
				if c == "guide-consumer" {
					consumerAllowed = consumerAllowed || matches
				} else if matches {
					t.Errorf("ingress rule %d lets %s pods reach the push port", i, c)
				}
			}
		}
	}
	if !consumerAllowed {
		t.Error("no ingress rule lets guide-consumer pods reach the push port")
	}
	publicOpen := false
	for _, rule := range np.Spec.Ingress {
		for _, p := range rule.Ports {
			if p.Port != nil && *p.Port == intstr.FromString("ws") {
				publicOpen = true
			}
		}
	}
	if !publicOpen {
		t.Error("the NetworkPolicy closes the public WebSocket port")
	}
}

func checkAutoscaling(t *testing.T, m *manifests, pods map[string]*corev1.PodTemplateSpec, v values) {
	gw := m.deployments[fullname+"-gateway"]
	if hpa := m.hpas[fullname+"-gateway"]; hpa != nil {
		if ref := hpa.Spec.ScaleTargetRef; ref.Kind != "Deployment" || ref.Name != gw.Name {
			t.Errorf("the HPA scales %s %s", ref.Kind, ref.Name)
		}
		if gw.Spec.Replicas != nil {
			t.Error("the gateway Deployment sets replicas while an HPA owns them")
		}
		if hpa.Spec.MinReplicas == nil || *hpa.Spec.MinReplicas > hpa.Spec.MaxReplicas {
			t.Errorf("HPA replicas %v..%d", hpa.Spec.MinReplicas, hpa.Spec.MaxReplicas)
		}
	}
	so := m.scaledObjects[fullname+"-guide-consumer"]
	if so == nil {
		if len(m.scaledObjects) > 0 {
			t.Errorf("unexpected ScaledObjects %v", slices.Collect(maps.Keys(m.scaledObjects)))
		}
		return
	}
	consumer := m.deployments[fullname+"-guide-consumer"]
	if ref := so.Spec.ScaleTargetRef; ref.Kind != "Deployment" || ref.Name != consumer.Name {
		t.Errorf("the ScaledObject scales %s %s", ref.Kind, ref.Name)
	}
	if consumer.Spec.Replicas != nil {
		t.Error("the consumer Deployment sets replicas while KEDA owns them")
	}
	consumerEnv := env(t, m, &pods["guide-consumer"].Spec.Containers[0])
	listenerEnv := env(t, m, &pods["expiry-listener"].Spec.Containers[0])
	partitions, err := strconv.Atoi(setting(t, listenerEnv, "STILLTHERE_TOPIC_PARTITIONS"))
	if err != nil {
		t.Fatal(err)
	}
	if partitions != v.Kafka.Partitions {
		t.Errorf("topic-partitions %d, kafka.partitions %d", partitions, v.Kafka.Partitions)
	}
	if so.Spec.MaxReplicaCount == nil {
		t.Error("no maxReplicaCount: KEDA's default may exceed the partitions")
	} else if max := int(*so.Spec.MaxReplicaCount); max > partitions {
		t.Errorf("maxReplicaCount %d exceeds the topic's %d partitions", max, partitions)
	}
	if so.Spec.MinReplicaCount == nil || *so.Spec.MinReplicaCount < 1 {
		t.Error("minReplicaCount below 1: a lag trigger never wakes a group with no member committing")
	}
	if len(so.Spec.Triggers) != 1 {
		t.Fatalf("%d triggers, want 1", len(so.Spec.Triggers))
	}
	tr := so.Spec.Triggers[0]
	want := map[string]string{
		"lagThreshold":         strconv.Itoa(v.Consumer.Keda.LagThreshold),
		"excludePersistentLag": "true",
		"allowIdleConsumers":   "false",
		"consumerGroup":        setting(t, consumerEnv, "STILLTHERE_CONSUMER_GROUP"),
		"topic":                setting(t, consumerEnv, "STILLTHERE_TOPIC"),
		"bootstrapServers":     setting(t, consumerEnv, "STILLTHERE_KAFKA_BROKERS"),
	}
	if tr.Type != "kafka" {
		t.Errorf("trigger type %q, want kafka", tr.Type)
	}
	for k, w := range want {
		if got := tr.Metadata[k]; got != w {
			t.Errorf("trigger %s = %q, want %q", k, got, w)
		}
	}
	secured := consumerEnv["STILLTHERE_KAFKA_TLS"] == "true" || consumerEnv["STILLTHERE_KAFKA_SASL_MECHANISM"] != "none"
	if !secured {
		return
	}
	if tr.AuthenticationRef == nil || m.triggerAuths[tr.AuthenticationRef.Name] == nil {
		t.Fatal("Kafka needs TLS or SASL, but the trigger has no rendered TriggerAuthentication")
	}
	params := map[string]bool{}
	for _, ref := range m.triggerAuths[tr.AuthenticationRef.Name].Spec.SecretTargetRef {
		params[ref.Parameter] = true
		if s := m.secrets[ref.Name]; s != nil {
			_, inData := s.Data[ref.Key]
			_, inString := s.StringData[ref.Key]
			if !inData && !inString {
				t.Errorf("TriggerAuthentication %s: Secret %s has no key %s", ref.Parameter, ref.Name, ref.Key)
			}
		} else if strings.HasPrefix(ref.Name, fullname) {
			t.Errorf("TriggerAuthentication %s: Secret %s is not rendered", ref.Parameter, ref.Name)
		}
	}
	for _, p := range []string{"sasl", "tls"} {
		if !params[p] {
			t.Errorf("TriggerAuthentication lacks %s", p)
		}
	}
	if consumerEnv["STILLTHERE_KAFKA_SASL_MECHANISM"] != "none" && !(params["username"] && params["password"]) {
		t.Error("TriggerAuthentication lacks the SASL user or password")
	}
}

func checkServiceMonitor(t *testing.T, m *manifests) {
	for _, sm := range m.monitors {
		for _, name := range []string{"gateway-internal", "expiry-listener", "guide-consumer"} {
			svc := m.services[fullname+"-"+name]
			if !selects(t, &sm.Spec.Selector, svc.Labels) {
				t.Errorf("ServiceMonitor %s does not select Service %s", sm.Name, svc.Name)
				continue
			}
			for _, ep := range sm.Spec.Endpoints {
				if !slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == ep.Port }) {
					t.Errorf("Service %s has no port %q", svc.Name, ep.Port)
				}
			}
		}
		if svc := m.services[fullname+"-gateway"]; selects(t, &sm.Spec.Selector, svc.Labels) {
			t.Error("the ServiceMonitor scrapes the public Service")
		}
	}
}

// TestChartRefusesBadValues: a value the chart cannot use fails the
// render with a message that names it.
func TestChartRefusesBadValues(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want []string // substrings of the error
	}{
		{"unknown SASL mechanism", []string{"--set", "kafka.sasl.mechanism=gssapi"},
			[]string{"/kafka/sasl/mechanism", "scram-sha-512"}},
		{"misspelt key", []string{"--set", "gateway.shutdownTimeout=20"},
			[]string{"/gateway", "shutdownTimeout"}},
		{"drain of the wrong type", []string{"--set-string", "gateway.shutdownTimeoutSeconds=ten"},
			[]string{"/gateway/shutdownTimeoutSeconds"}},
		{"short token secret", []string{"--set", "secrets.tokenSecret=short"},
			[]string{"/secrets/tokenSecret"}},
		{"redis address without a port", []string{"--set", "redis.addrs={redis}"},
			[]string{"/redis/addrs/0"}},
		{"more KEDA replicas than partitions", []string{"--set", "consumer.keda.enabled=true", "--set", "kafka.partitions=6", "--set", "consumer.keda.maxReplicaCount=8"},
			[]string{"consumer.keda.maxReplicaCount (8) exceeds kafka.partitions (6)"}},
		{"drain through the free-form map", []string{"--set", "gateway.config.shutdown-timeout=5s"},
			[]string{"gateway.config.shutdown-timeout", "STILLTHERE_SHUTDOWN_TIMEOUT"}},
		{"drain through extraEnv", []string{"--set", "gateway.extraEnv[0].name=STILLTHERE_SHUTDOWN_TIMEOUT", "--set", "gateway.extraEnv[0].value=5s"},
			[]string{"gateway.extraEnv", "STILLTHERE_SHUTDOWN_TIMEOUT"}},
		{"secret in a ConfigMap", []string{"--set", "consumer.config.webhook-secret=x"},
			[]string{"consumer.config.webhook-secret", "secret"}},
		{"SASL without a password", []string{"--set", "kafka.sasl.mechanism=plain", "--set", "kafka.sasl.username=u"},
			[]string{"kafka.sasl.password"}},
		{"webhook without a URL", []string{"--set", "consumer.sender=webhook", "--set", "secrets.webhookSecret=webhook-secret-for-tests-0123456789"},
			[]string{"consumer.webhookURL"}},
		{"notify URL not http(s)", []string{"--set", "consumer.notifyURL=ftp://platform.example.com/notify", "--set", "secrets.notifySecret=notify-secret-for-tests-0123456789ab"},
			[]string{"/consumer/notifyURL"}},
		{"notify URL without a host", []string{"--set", "consumer.notifyURL=https:///notify", "--set", "secrets.notifySecret=notify-secret-for-tests-0123456789ab"},
			[]string{"/consumer/notifyURL"}},
		{"notify URL through the consumer's map", []string{"--set", "consumer.config.notify-url=https://platform.example.com/notify"},
			[]string{"consumer.config.notify-url", "STILLTHERE_NOTIFY_URL"}},
		{"notify URL through the common map", []string{"--set", "config.STILLTHERE_NOTIFY_URL=https://platform.example.com/notify"},
			[]string{"config.STILLTHERE_NOTIFY_URL", "STILLTHERE_NOTIFY_URL"}},
		{"notify URL through extraEnv", []string{"--set", "consumer.extraEnv[0].name=STILLTHERE_NOTIFY_URL", "--set", "consumer.extraEnv[0].value=https://platform.example.com/notify"},
			[]string{"consumer.extraEnv", "STILLTHERE_NOTIFY_URL"}},
		{"notify secret in a ConfigMap", []string{"--set", "consumer.config.notify-secret=notify-secret-for-tests-0123456789ab"},
			[]string{"consumer.config.notify-secret: a secret does not belong in a ConfigMap"}},
		{"heartbeat interval out of range", []string{"--set", "gateway.heartbeatInterval=20s"},
			[]string{"gateway.heartbeatInterval: 20s, want between 100ms and 10s"}},
		{"shed-after out of range", []string{"--set", "gateway.shedAfter=11m", "--set", "listener.outageGrace=1h"},
			[]string{"gateway.shedAfter: 11m, want between 0 and 10m"}},
		{"shed-after not a duration", []string{"--set-string", "gateway.shedAfter=15"},
			[]string{"/gateway/shedAfter"}},
		{"shed-after a number other than 0", []string{"--set", "gateway.shedAfter=15"},
			[]string{"/gateway/shedAfter"}},
		{"shed-after through the free-form map", []string{"--set", "gateway.config.shed-after=5s"},
			[]string{"gateway.config.shed-after", "STILLTHERE_SHED_AFTER"}},
		{"shed-after through the common map", []string{"--set", "config.STILLTHERE_SHED_AFTER=5s"},
			[]string{"config.STILLTHERE_SHED_AFTER", "STILLTHERE_SHED_AFTER"}},
		{"shed-after + reconnect up to the grace", []string{"--set", "gateway.shedAfter=65s"},
			[]string{"gateway.shedAfter: 65s + 10s to reconnect is not under listener.outageGrace 75s", "above 75s", "below 65s"}},
		{"shed-after + reconnect over a raised grace", []string{"--set", "gateway.shedAfter=2m", "--set", "listener.outageGrace=90s"},
			[]string{"gateway.shedAfter: 2m + 10s to reconnect is not under listener.outageGrace 90s", "above 130s", "below 80s"}},
		{"outage grace not a duration", []string{"--set-string", "listener.outageGrace=75"},
			[]string{"/listener/outageGrace"}},
		{"outage grace under a TTL", []string{"--set", "gateway.sessionTTL=90s"},
			[]string{"listener.outageGrace: 75s", "session-ttl 90s + session-jitter 5s + 10s", "at least 105s"}},
		{"outage grace under a TTL from the free-form map", []string{"--set", "gateway.config.STILLTHERE_SESSION_TTL=2m", "--set", "gateway.config.session-jitter=1m"},
			[]string{"listener.outageGrace: 75s", "session-ttl 2m + session-jitter 1m", "at least 190s"}},
		{"outage grace through the free-form map", []string{"--set", "listener.config.outage-grace=5m"},
			[]string{"listener.config.outage-grace", "STILLTHERE_OUTAGE_GRACE"}},
		{"heartbeat through the common map", []string{"--set", "config.heartbeat-interval=2s"},
			[]string{"config.heartbeat-interval", "STILLTHERE_HEARTBEAT_INTERVAL"}},
		{"pprof through the free-form map", []string{"--set", "gateway.config.pprof=true"},
			[]string{"gateway.config.pprof", "STILLTHERE_PPROF"}},
		{"pprof through the common map", []string{"--set", "config.STILLTHERE_PPROF=true"},
			[]string{"config.STILLTHERE_PPROF", "STILLTHERE_PPROF"}},
		{"pprof not a boolean", []string{"--set-string", "listener.pprof=yes"},
			[]string{"/listener/pprof"}},
		{"short webhook secret", []string{"--set", "consumer.sender=webhook", "--set", "consumer.webhookURL=https://im.example.com/hook", "--set", "secrets.webhookSecret=short"},
			[]string{"/secrets/webhookSecret"}},
		{"sweep gap under twice the sweep interval", []string{"--set", "listener.config.sweep-interval=1500ms"},
			[]string{"listener.sweepGapMax: 2s, want at least twice sweep-interval (1500ms)"}},
		{"clock jump too small", []string{"--set", "listener.clockJumpMax=10ms"},
			[]string{"listener.clockJumpMax: 10ms, want at least 100ms"}},
		{"brake window too long", []string{"--set", "listener.massExpiry.window=1h"},
			[]string{"listener.massExpiry.window: 1h, want between 1s and 10m"}},
		{"brake share of 0", []string{"--set", "listener.massExpiry.share=0"},
			[]string{"/listener/massExpiry/share"}},
		{"brake share above 1", []string{"--set", "listener.massExpiry.share=1.5"},
			[]string{"/listener/massExpiry/share"}},
		{"brake floor of 0", []string{"--set", "listener.massExpiry.floor=0"},
			[]string{"/listener/massExpiry/floor"}},
		{"brake release rate negative", []string{"--set", "listener.massExpiry.releaseRate=-1"},
			[]string{"/listener/massExpiry/releaseRate"}},
		{"brake release rate too high", []string{"--set", "listener.massExpiry.releaseRate=2000000"},
			[]string{"/listener/massExpiry/releaseRate"}},
		{"brake release rate through the free-form map", []string{"--set", "listener.config.mass-expiry-release-rate=5000"},
			[]string{"listener.config.mass-expiry-release-rate", "STILLTHERE_MASS_EXPIRY_RELEASE_RATE"}},
		{"sweep gap under twice the prefetch interval", []string{"--set", "listener.sweepGapMax=800ms"},
			[]string{"listener.sweepGapMax: 800ms, want at least twice prefetch-interval (500ms)"}},
		{"sweep gap under twice a raised prefetch interval", []string{"--set", "listener.config.prefetch-interval=1500ms"},
			[]string{"listener.sweepGapMax: 2s, want at least twice prefetch-interval (1500ms)"}},
		{"unknown read mode", []string{"--set", "gateway.readMode=io_uring"},
			[]string{"/gateway/readMode"}},
		{"alert matchers that are not PromQL", []string{"--set", "prometheusRule.enabled=true", "--set", "prometheusRule.matchers=namespace"},
			[]string{"/prometheusRule/matchers"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := render(t, append(slices.Clone(secretValues), tc.args...)...)
			if err == nil {
				t.Fatalf("helm template %q succeeded, want an error naming %q", tc.args, tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not name %q:\n%v", w, err)
				}
			}
		})
	}
}
