package helm

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

const (
	chartDir  = "stillthere"
	release   = "st"
	namespace = "chat"
)

// helmBinary finds helm on PATH or in GOPATH/bin, where deploy/helm/check.sh
// installs it. Without it the chart tests skip, unless
// STILLTHERE_REQUIRE_HELM is set, as CI sets it.
func helmBinary(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("helm"); err == nil {
		return p
	}
	if gopath, err := exec.Command("go", "env", "GOPATH").Output(); err == nil {
		p := filepath.Join(strings.TrimSpace(string(gopath)), "bin", "helm")
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if os.Getenv("STILLTHERE_REQUIRE_HELM") != "" {
		t.Fatal("helm is not installed and STILLTHERE_REQUIRE_HELM is set: run deploy/helm/check.sh (or make chart) to install it")
	}
	t.Skip("helm is not installed: run deploy/helm/check.sh (or make chart) to install it, or set STILLTHERE_REQUIRE_HELM to make this a failure")
	return ""
}

// render runs helm template on the chart with extra arguments.
func render(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(helmBinary(t), append([]string{"template", release, chartDir, "--namespace", namespace}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("helm template %s: %v: %s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

// Minimal typed forms of the custom resources the chart renders. Decoded
// strictly, a field the chart sets that is not here fails the test: add
// it here after checking the CRD's schema.
type scaledObject struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		ScaleTargetRef struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Name       string `json:"name"`
		} `json:"scaleTargetRef"`
		MinReplicaCount *int32 `json:"minReplicaCount"`
		MaxReplicaCount *int32 `json:"maxReplicaCount"`
		PollingInterval *int32 `json:"pollingInterval"`
		CooldownPeriod  *int32 `json:"cooldownPeriod"`
		Triggers        []struct {
			Type              string            `json:"type"`
			Metadata          map[string]string `json:"metadata"`
			AuthenticationRef *struct {
				Name string `json:"name"`
			} `json:"authenticationRef"`
		} `json:"triggers"`
	} `json:"spec"`
}

type triggerAuthentication struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		SecretTargetRef []struct {
			Parameter string `json:"parameter"`
			Name      string `json:"name"`
			Key       string `json:"key"`
		} `json:"secretTargetRef"`
	} `json:"spec"`
}

type serviceMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Selector  metav1.LabelSelector `json:"selector"`
		Endpoints []struct {
			Port          string `json:"port"`
			Path          string `json:"path"`
			Interval      string `json:"interval"`
			ScrapeTimeout string `json:"scrapeTimeout"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// prometheusRule holds alerting rules and recording rules (the canary's
// SLO); anything else would fail the strict decode.
type prometheusRule struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Groups []struct {
			Name  string `json:"name"`
			Rules []struct {
				Alert       string            `json:"alert"`
				Record      string            `json:"record"`
				Expr        string            `json:"expr"`
				For         string            `json:"for"`
				Labels      map[string]string `json:"labels"`
				Annotations map[string]string `json:"annotations"`
			} `json:"rules"`
		} `json:"groups"`
	} `json:"spec"`
}

// manifests is a rendered chart, by kind and name.
type manifests struct {
	deployments   map[string]*appsv1.Deployment
	statefulSets  map[string]*appsv1.StatefulSet
	services      map[string]*corev1.Service
	configMaps    map[string]*corev1.ConfigMap
	secrets       map[string]*corev1.Secret
	accounts      map[string]*corev1.ServiceAccount
	pdbs          map[string]*policyv1.PodDisruptionBudget
	netpols       map[string]*networkingv1.NetworkPolicy
	hpas          map[string]*autoscalingv2.HorizontalPodAutoscaler
	scaledObjects map[string]*scaledObject
	triggerAuths  map[string]*triggerAuthentication
	monitors      map[string]*serviceMonitor
	rules         map[string]*prometheusRule
}

// decode splits helm's output into documents and decodes each strictly
// into its API type: an unknown field or an unexpected kind is an error.
func decode(out string) (*manifests, error) {
	m := &manifests{
		deployments: map[string]*appsv1.Deployment{}, statefulSets: map[string]*appsv1.StatefulSet{},
		services: map[string]*corev1.Service{}, configMaps: map[string]*corev1.ConfigMap{},
		secrets: map[string]*corev1.Secret{}, accounts: map[string]*corev1.ServiceAccount{},
		pdbs: map[string]*policyv1.PodDisruptionBudget{}, netpols: map[string]*networkingv1.NetworkPolicy{},
		hpas: map[string]*autoscalingv2.HorizontalPodAutoscaler{}, scaledObjects: map[string]*scaledObject{},
		triggerAuths: map[string]*triggerAuthentication{}, monitors: map[string]*serviceMonitor{},
		rules: map[string]*prometheusRule{},
	}
	var errs []error
	for i, doc := range splitDocuments(out) {
		var head metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
			errs = append(errs, fmt.Errorf("document %d: %w", i, err))
			continue
		}
		if head.Kind == "" {
			continue // comments only
		}
		var err error
		var name string
		switch head.APIVersion + " " + head.Kind {
		case "apps/v1 Deployment":
			name, err = into(doc, m.deployments)
		case "apps/v1 StatefulSet":
			name, err = into(doc, m.statefulSets)
		case "v1 Service":
			name, err = into(doc, m.services)
		case "v1 ConfigMap":
			name, err = into(doc, m.configMaps)
		case "v1 Secret":
			name, err = into(doc, m.secrets)
		case "v1 ServiceAccount":
			name, err = into(doc, m.accounts)
		case "policy/v1 PodDisruptionBudget":
			name, err = into(doc, m.pdbs)
		case "networking.k8s.io/v1 NetworkPolicy":
			name, err = into(doc, m.netpols)
		case "autoscaling/v2 HorizontalPodAutoscaler":
			name, err = into(doc, m.hpas)
		case "keda.sh/v1alpha1 ScaledObject":
			name, err = into(doc, m.scaledObjects)
		case "keda.sh/v1alpha1 TriggerAuthentication":
			name, err = into(doc, m.triggerAuths)
		case "monitoring.coreos.com/v1 ServiceMonitor":
			name, err = into(doc, m.monitors)
		case "monitoring.coreos.com/v1 PrometheusRule":
			name, err = into(doc, m.rules)
		default:
			err = fmt.Errorf("unexpected %s %s: teach the test about it", head.APIVersion, head.Kind)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s %s: %w", head.Kind, name, err))
		}
	}
	return m, errors.Join(errs...)
}

// into decodes doc strictly into a new T and files it by name.
func into[T any, PT interface {
	*T
	GetName() string
}](doc string, byName map[string]PT) (string, error) {
	obj := PT(new(T))
	if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
		return "", err
	}
	name := obj.GetName()
	if _, dup := byName[name]; dup {
		return name, errors.New("rendered twice")
	}
	byName[name] = obj
	return name, nil
}

func splitDocuments(out string) []string {
	var docs []string
	var cur strings.Builder
	for _, line := range strings.SplitAfter(out, "\n") {
		if strings.TrimRight(line, "\n") == "---" {
			docs = append(docs, cur.String())
			cur.Reset()
			continue
		}
		cur.WriteString(line)
	}
	return append(docs, cur.String())
}
