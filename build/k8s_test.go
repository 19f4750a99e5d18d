package build

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	wasmfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	wasmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/wasm/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/kustomize/api/krusty"
	kusttypes "sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/wasm-epp/wasm-epp/envoy"
	"github.com/wasm-epp/wasm-epp/envoy/bootstrap"
	"github.com/wasm-epp/wasm-epp/metricsagent"
	"github.com/wasm-epp/wasm-epp/plugin/config"
	"github.com/wasm-epp/wasm-epp/scheduler/wire"
)

const k8sDir = "k8s"

// newObject maps every kind the manifests may use to its k8s.io/api type.
// A kind not listed fails the strict-decoding test: add it here on purpose.
var newObject = map[string]func() any{
	"v1/Namespace":                                  func() any { return &corev1.Namespace{} },
	"v1/ServiceAccount":                             func() any { return &corev1.ServiceAccount{} },
	"v1/Service":                                    func() any { return &corev1.Service{} },
	"v1/ConfigMap":                                  func() any { return &corev1.ConfigMap{} },
	"v1/Secret":                                     func() any { return &corev1.Secret{} },
	"apps/v1/Deployment":                            func() any { return &appsv1.Deployment{} },
	"apps/v1/DaemonSet":                             func() any { return &appsv1.DaemonSet{} },
	"rbac.authorization.k8s.io/v1/Role":             func() any { return &rbacv1.Role{} },
	"rbac.authorization.k8s.io/v1/RoleBinding":      func() any { return &rbacv1.RoleBinding{} },
	"networking.k8s.io/v1/NetworkPolicy":            func() any { return &networkingv1.NetworkPolicy{} },
	"policy/v1/PodDisruptionBudget":                 func() any { return &policyv1.PodDisruptionBudget{} },
	"kustomize.config.k8s.io/v1beta1/Kustomization": func() any { return &kusttypes.Kustomization{} },
}

// inferenceObjects are the CRD kinds the agent reads; they are decoded by
// the agent's own types, as the agent decodes them (spec strictly).
var inferenceObjects = map[string]func([]byte) (any, error){
	"inference.networking.k8s.io/v1/InferencePool": func(js []byte) (any, error) { return metricsagent.DecodeInferencePool(js) },
	"llm-d.ai/v1alpha2/InferenceObjective":         func(js []byte) (any, error) { return metricsagent.DecodeInferenceObjective(js) },
	"llm-d.ai/v1alpha2/InferenceModelRewrite":      func(js []byte) (any, error) { return metricsagent.DecodeInferenceModelRewrite(js) },
}

// crdGroups have no k8s.io/api types; their objects are checked as maps by
// TestIstioAndEnvoyGatewayExamples.
var crdGroups = []string{"networking.istio.io", "extensions.istio.io", "gateway.envoyproxy.io", "gateway.networking.k8s.io"}

// bootstrapFiles are Envoy bootstraps, not Kubernetes objects: they are
// validated through the ConfigMap built from them.
var bootstrapFiles = []string{"k8s/base/envoy.yaml"}

type manifest struct {
	file string
	doc  []byte
	kind string // apiVersion/kind
}

func splitDocs(data []byte) [][]byte {
	var out [][]byte
	for _, d := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(data), -1) {
		if strings.TrimSpace(stripComments(d)) != "" {
			out = append(out, []byte(d))
		}
	}
	return out
}

func stripComments(s string) string {
	var b strings.Builder
	for _, l := range strings.Split(s, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

func kindOf(t *testing.T, doc []byte) string {
	var tm metav1.TypeMeta
	require.NoError(t, yaml.Unmarshal(doc, &tm))
	return tm.APIVersion + "/" + tm.Kind
}

func allManifests(t *testing.T) []manifest {
	var out []manifest
	err := filepath.WalkDir(k8sDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || filepath.Ext(path) != ".yaml" || slices.Contains(bootstrapFiles, path) {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, doc := range splitDocs(data) {
			out = append(out, manifest{file: path, doc: doc, kind: kindOf(t, doc)})
		}
		return nil
	})
	require.NoError(t, err)
	require.NotEmpty(t, out)
	return out
}

func isCRD(kind string) bool {
	return slices.ContainsFunc(crdGroups, func(g string) bool { return strings.HasPrefix(kind, g+"/") })
}

// decodeStrict decodes one YAML document into its k8s.io/api type the way
// the API server does: field names are case-sensitive (encoding/json alone
// would accept "clusterIp" for "clusterIP"), unknown and duplicate fields are
// errors.
func decodeStrict(kind string, doc []byte) (any, error) {
	js, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return nil, err
	}
	if decode, ok := inferenceObjects[kind]; ok {
		return decode(js)
	}
	mk, ok := newObject[kind]
	if !ok {
		return nil, fmt.Errorf("kind %s has no k8s.io/api type listed in newObject", kind)
	}
	obj := mk()
	strict, err := kjson.UnmarshalStrict(js, obj, kjson.DisallowDuplicateFields, kjson.DisallowUnknownFields)
	if err != nil {
		return nil, err
	}
	if len(strict) > 0 {
		return nil, fmt.Errorf("%s: %v", kind, strict)
	}
	return obj, nil
}

func TestManifestsDecodeStrictly(t *testing.T) {
	for _, m := range allManifests(t) {
		if isCRD(m.kind) {
			continue
		}
		t.Run(m.file+"/"+m.kind, func(t *testing.T) {
			_, err := decodeStrict(m.kind, m.doc)
			require.NoError(t, err)
		})
	}
}

// TestStrictDecodingRejectsUnknownFields proves the decoding above is strict.
func TestStrictDecodingRejectsUnknownFields(t *testing.T) {
	for _, doc := range []string{
		"apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {clusterIp: None}\n",
		"apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: x}\nspec: {template: {spec: {containers: [{name: a, image: b, readOnlyRootFS: true}]}}}\n",
		"apiVersion: v1\nkind: Service\nmetadata: {name: x, name: y}\n",
		"apiVersion: inference.networking.k8s.io/v1\nkind: InferencePool\nmetadata: {name: x}\nspec: {selector: {matchLabels: {a: b}}, targetPorts: [{number: 80}], targetPortNumber: 80}\n",
		"apiVersion: llm-d.ai/v1alpha2\nkind: InferenceObjective\nmetadata: {name: x}\nspec: {poolRef: {name: p}, criticality: Critical}\n",
		"apiVersion: llm-d.ai/v1alpha2\nkind: InferenceModelRewrite\nmetadata: {name: x}\nspec: {poolRef: {name: p}, rules: [{targets: [{modelRewrite: m, weight: -1}]}]}\n",
	} {
		_, err := decodeStrict(kindOf(t, []byte(doc)), []byte(doc))
		assert.Error(t, err, doc)
	}
}

// built is one kustomization's output, decoded into typed objects.
type built struct {
	dir         string
	deployments []*appsv1.Deployment
	daemonSets  []*appsv1.DaemonSet
	services    []*corev1.Service
	configMaps  []*corev1.ConfigMap
	secrets     []*corev1.Secret
	roles       []*rbacv1.Role
	bindings    []*rbacv1.RoleBinding
	accounts    []*corev1.ServiceAccount
	policies    []*networkingv1.NetworkPolicy
	pdbs        []*policyv1.PodDisruptionBudget
	pools       []*metricsagent.InferencePool
	inferenceJS [][]byte // InferenceObjectives and InferenceModelRewrites, as JSON
	objectives  int
	rewrites    int
}

// workload is a Deployment or DaemonSet seen through its pod template.
type workload struct {
	name     string
	selector *metav1.LabelSelector
	template *corev1.PodTemplateSpec
}

func (b *built) workloads() []workload {
	var out []workload
	for _, d := range b.deployments {
		out = append(out, workload{d.Name, d.Spec.Selector, &d.Spec.Template})
	}
	for _, d := range b.daemonSets {
		out = append(out, workload{d.Name, d.Spec.Selector, &d.Spec.Template})
	}
	return out
}

func (b *built) deployment(t *testing.T, name string) *appsv1.Deployment {
	for _, d := range b.deployments {
		if d.Name == name {
			return d
		}
	}
	t.Fatalf("%s: no Deployment %s", b.dir, name)
	return nil
}

func (b *built) daemonSet(t *testing.T, name string) *appsv1.DaemonSet {
	for _, d := range b.daemonSets {
		if d.Name == name {
			return d
		}
	}
	t.Fatalf("%s: no DaemonSet %s", b.dir, name)
	return nil
}

func kustomizations(t *testing.T) []string {
	var dirs []string
	require.NoError(t, filepath.WalkDir(k8sDir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.Name() == "kustomization.yaml" {
			dirs = append(dirs, filepath.Dir(path))
		}
		return err
	}))
	require.NotEmpty(t, dirs)
	return dirs
}

func build(t *testing.T, dir string) *built {
	t.Helper()
	res, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	require.NoError(t, err, "kustomize build %s", dir)
	b := &built{dir: dir}
	for _, r := range res.Resources() {
		doc, err := r.AsYAML()
		require.NoError(t, err)
		obj, err := decodeStrict(kindOf(t, doc), doc)
		require.NoError(t, err, "%s: %s %s", dir, r.GetKind(), r.GetName())
		switch o := obj.(type) {
		case *appsv1.Deployment:
			b.deployments = append(b.deployments, o)
		case *appsv1.DaemonSet:
			b.daemonSets = append(b.daemonSets, o)
		case *corev1.Service:
			b.services = append(b.services, o)
		case *corev1.ConfigMap:
			b.configMaps = append(b.configMaps, o)
		case *corev1.Secret:
			b.secrets = append(b.secrets, o)
		case *rbacv1.Role:
			b.roles = append(b.roles, o)
		case *rbacv1.RoleBinding:
			b.bindings = append(b.bindings, o)
		case *corev1.ServiceAccount:
			b.accounts = append(b.accounts, o)
		case *networkingv1.NetworkPolicy:
			b.policies = append(b.policies, o)
		case *policyv1.PodDisruptionBudget:
			b.pdbs = append(b.pdbs, o)
		case *metricsagent.InferencePool:
			b.pools = append(b.pools, o)
		case *metricsagent.InferenceObjective, *metricsagent.InferenceModelRewrite:
			js, err := yaml.YAMLToJSONStrict(doc)
			require.NoError(t, err)
			b.inferenceJS = append(b.inferenceJS, js)
			if _, ok := o.(*metricsagent.InferenceObjective); ok {
				b.objectives++
			} else {
				b.rewrites++
			}
		}
	}
	return b
}

// externalSecrets may be referenced without being part of a build: the
// operator creates them (see build/k8s/base/kustomization.yaml).
var externalSecrets = map[string][]string{"k8s/base": {"wasm-epp-push-token"}}

func TestKustomizationsBuildAndAgree(t *testing.T) {
	for _, dir := range kustomizations(t) {
		t.Run(dir, func(t *testing.T) {
			b := build(t, dir)
			checkSelectorsAndPorts(t, b)
			checkReferences(t, b)
			checkPodSecurity(t, b)
			checkRBAC(t, b)
			checkGateway(t, b)
			checkAgent(t, b)
		})
	}
}

func checkSelectorsAndPorts(t *testing.T, b *built) {
	workloads := b.workloads()
	for _, w := range workloads {
		sel, err := metav1.LabelSelectorAsSelector(w.selector)
		require.NoError(t, err, w.name)
		assert.False(t, sel.Empty(), "%s: empty selector", w.name)
		assert.True(t, sel.Matches(labels.Set(w.template.Labels)), "%s: selector %s does not match its template labels %v", w.name, sel, w.template.Labels)
		for _, c := range allContainers(w.template) {
			for _, p := range []*corev1.Probe{c.ReadinessProbe, c.LivenessProbe, c.StartupProbe} {
				if p == nil {
					continue
				}
				switch {
				case p.HTTPGet != nil:
					assert.True(t, hasPort(c, p.HTTPGet.Port), "%s/%s: probe port %s is not a container port", w.name, c.Name, p.HTTPGet.Port.String())
				case p.TCPSocket != nil:
					assert.True(t, hasPort(c, p.TCPSocket.Port), "%s/%s: probe port %s is not a container port", w.name, c.Name, p.TCPSocket.Port.String())
				}
			}
		}
	}
	matching := func(sel labels.Selector) []workload {
		var out []workload
		for _, w := range workloads {
			if sel.Matches(labels.Set(w.template.Labels)) {
				out = append(out, w)
			}
		}
		return out
	}
	for _, s := range b.services {
		targets := matching(labels.SelectorFromSet(s.Spec.Selector))
		require.NotEmpty(t, targets, "%s: Service %s selects no workload", b.dir, s.Name)
		for _, w := range targets {
			for _, sp := range s.Spec.Ports {
				assert.True(t, slices.ContainsFunc(w.template.Spec.Containers, func(c corev1.Container) bool { return hasPort(c, sp.TargetPort) }),
					"Service %s port %s: targetPort %s is not a container port of %s", s.Name, sp.Name, sp.TargetPort.String(), w.name)
			}
		}
	}
	for _, np := range b.policies {
		sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
		require.NoError(t, err)
		targets := matching(sel)
		require.NotEmpty(t, targets, "NetworkPolicy %s selects no workload", np.Name)
		for _, rule := range np.Spec.Ingress {
			for _, p := range rule.Ports {
				for _, w := range targets {
					assert.True(t, slices.ContainsFunc(w.template.Spec.Containers, func(c corev1.Container) bool { return hasPort(c, *p.Port) }),
						"NetworkPolicy %s: port %s is not a container port of %s", np.Name, p.Port.String(), w.name)
				}
			}
			for _, peer := range rule.From {
				if peer.PodSelector != nil {
					psel, err := metav1.LabelSelectorAsSelector(peer.PodSelector)
					require.NoError(t, err)
					assert.NotEmpty(t, matching(psel), "NetworkPolicy %s: peer %s matches no workload", np.Name, psel)
				}
			}
		}
	}
	for _, pdb := range b.pdbs {
		sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
		require.NoError(t, err)
		assert.NotEmpty(t, matching(sel), "PodDisruptionBudget %s selects no workload", pdb.Name)
	}
}

func hasPort(c corev1.Container, p intstr.IntOrString) bool {
	return slices.ContainsFunc(c.Ports, func(cp corev1.ContainerPort) bool {
		if p.Type == intstr.String {
			return cp.Name == p.StrVal
		}
		return cp.ContainerPort == p.IntVal
	})
}

func allContainers(t *corev1.PodTemplateSpec) []corev1.Container {
	return append(slices.Clone(t.Spec.InitContainers), t.Spec.Containers...)
}

// checkReferences: every Secret, ConfigMap and ServiceAccount a pod uses is
// part of the build (or an external Secret the operator creates), and every
// $(VAR) in args names an env var of that container.
func checkReferences(t *testing.T, b *built) {
	names := func(kind string) []string {
		var out []string
		switch kind {
		case "Secret":
			for _, s := range b.secrets {
				out = append(out, s.Name)
			}
			out = append(out, externalSecrets[b.dir]...)
		case "ConfigMap":
			for _, c := range b.configMaps {
				out = append(out, c.Name)
			}
		case "ServiceAccount":
			out = append(out, "default", "")
			for _, a := range b.accounts {
				out = append(out, a.Name)
			}
		}
		return out
	}
	varRef := regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)
	for _, w := range b.workloads() {
		spec := w.template.Spec
		assert.Contains(t, names("ServiceAccount"), spec.ServiceAccountName, "%s: service account", w.name)
		for _, v := range spec.Volumes {
			if v.Secret != nil {
				assert.Contains(t, names("Secret"), v.Secret.SecretName, "%s: volume %s", w.name, v.Name)
			}
			if v.ConfigMap != nil {
				assert.Contains(t, names("ConfigMap"), v.ConfigMap.Name, "%s: volume %s", w.name, v.Name)
			}
		}
		for _, c := range allContainers(w.template) {
			env := map[string]bool{}
			for _, e := range c.Env {
				env[e.Name] = true
				if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
					assert.Contains(t, names("Secret"), e.ValueFrom.SecretKeyRef.Name, "%s/%s: env %s", w.name, c.Name, e.Name)
				}
			}
			for _, vm := range c.VolumeMounts {
				assert.True(t, slices.ContainsFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == vm.Name }), "%s/%s: mount of unknown volume %s", w.name, c.Name, vm.Name)
			}
			for _, a := range append(slices.Clone(c.Command), c.Args...) {
				for _, m := range varRef.FindAllStringSubmatch(a, -1) {
					assert.True(t, env[m[1]], "%s/%s: %q uses $(%s), which is not an env var of the container", w.name, c.Name, a, m[1])
				}
			}
		}
	}
	for _, s := range b.secrets {
		assert.NotEmpty(t, s.Data["token"], "Secret %s needs a token", s.Name)
	}
}

func checkPodSecurity(t *testing.T, b *built) {
	for _, w := range b.workloads() {
		psc := w.template.Spec.SecurityContext
		require.NotNil(t, psc, "%s: pod securityContext", w.name)
		assert.True(t, psc.RunAsNonRoot != nil && *psc.RunAsNonRoot, "%s: runAsNonRoot", w.name)
		assert.NotNil(t, psc.RunAsUser, "%s: runAsUser (images may not declare a numeric user)", w.name)
		for _, c := range allContainers(w.template) {
			sc := c.SecurityContext
			where := w.name + "/" + c.Name
			require.NotNil(t, sc, where)
			assert.True(t, sc.ReadOnlyRootFilesystem != nil && *sc.ReadOnlyRootFilesystem, "%s: readOnlyRootFilesystem", where)
			assert.True(t, sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation, "%s: allowPrivilegeEscalation false", where)
			assert.True(t, sc.Capabilities != nil && slices.Contains(sc.Capabilities.Drop, "ALL"), "%s: drop ALL capabilities", where)
			assert.False(t, sc.Privileged != nil && *sc.Privileged, where)
			for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
				assert.Contains(t, c.Resources.Requests, r, "%s: %s request", where, r)
				assert.Contains(t, c.Resources.Limits, r, "%s: %s limit", where, r)
			}
		}
	}
}

// allowedRules are every permission anything may get: reading pods, and
// for --inference-pool reading the pool's objects and writing the Accepted
// condition of objectives and rewrites (their status subresource only).
var allowedRules = []rbacv1.PolicyRule{
	{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}},
	{APIGroups: []string{"inference.networking.k8s.io"}, Resources: []string{"inferencepools"}, Verbs: []string{"get", "list", "watch"}},
	{APIGroups: []string{"llm-d.ai"}, Resources: []string{"inferenceobjectives", "inferencemodelrewrites"}, Verbs: []string{"get", "list", "watch"}},
	{APIGroups: []string{"llm-d.ai"}, Resources: []string{"inferenceobjectives/status", "inferencemodelrewrites/status"}, Verbs: []string{"update"}},
}

// checkRBAC: nothing gets a permission beyond allowedRules.
func checkRBAC(t *testing.T, b *built) {
	for _, r := range b.roles {
		for _, rule := range r.Rules {
			assert.True(t, slices.ContainsFunc(allowedRules, func(a rbacv1.PolicyRule) bool {
				return slices.Equal(a.APIGroups, rule.APIGroups) && slices.Equal(a.Resources, rule.Resources) &&
					slices.Equal(a.Verbs, rule.Verbs) && len(rule.ResourceNames) == 0 && len(rule.NonResourceURLs) == 0
			}), "Role %s: rule %+v is not one of the allowed ones", r.Name, rule)
		}
	}
	for _, rb := range b.bindings {
		assert.True(t, slices.ContainsFunc(b.roles, func(r *rbacv1.Role) bool { return r.Name == rb.RoleRef.Name && rb.RoleRef.Kind == "Role" }), "RoleBinding %s: role", rb.Name)
		for _, s := range rb.Subjects {
			assert.Equal(t, "ServiceAccount", s.Kind)
			assert.Equal(t, rb.Namespace, s.Namespace, "RoleBinding %s: subject namespace", rb.Name)
		}
	}
}

const (
	gatewayName   = "wasm-epp-gateway"
	agentName     = "wasm-epp-agent"
	pushService   = "wasm-epp-push"
	gatewayServce = "wasm-epp-gateway"
	tokenEnv      = "WASM_EPP_PUSH_TOKEN"
)

// checkGateway: the Envoy Deployment, its bootstrap and its Services fit
// together, and the bootstrap passes the same checks as envoy/envoy.yaml.
func checkGateway(t *testing.T, b *built) {
	d := b.deployment(t, gatewayName)
	require.NotNil(t, d.Spec.Replicas)
	assert.GreaterOrEqual(t, *d.Spec.Replicas, int32(2), "the gateway runs at least 2 replicas")
	spec := d.Spec.Template.Spec
	assert.False(t, spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken, "Envoy needs no API token")
	require.Len(t, spec.Containers, 1)
	envoyC := spec.Containers[0]

	tokenFromSecret := slices.ContainsFunc(envoyC.Env, func(e corev1.EnvVar) bool {
		return e.Name == tokenEnv && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil
	})
	assert.True(t, tokenFromSecret, "%s must come from a Secret", tokenEnv)

	// The bootstrap: from the ConfigMap mounted where --config-path points.
	configPath := flagValue(t, append(slices.Clone(envoyC.Command), envoyC.Args...), "config-path")
	doc := fileInPod(t, b, spec, envoyC, configPath)
	bs, err := bootstrap.Load(doc)
	require.NoError(t, err)

	plugins, err := envoy.Plugins(bs)
	require.NoError(t, err)
	require.NotEmpty(t, plugins)
	wasmFile := plugins[0].Wasm.GetConfig().GetVmConfig().GetCode().GetLocal().GetFilename()
	require.NoError(t, envoy.Check(bs, envoy.Rules{WasmFile: wasmFile}))

	// The plugin file: written by the init container into a volume Envoy mounts.
	require.Len(t, spec.InitContainers, 1)
	install := spec.InitContainers[0]
	assert.Equal(t, []string{wasmFile}, install.Args, "the init container copies the plugin to the path the bootstrap loads")
	assert.True(t, mountedFrom(spec, envoyC, wasmFile) != "" && mountedFrom(spec, envoyC, wasmFile) == mountedFrom(spec, install, wasmFile),
		"%s must be on a volume shared by the init container and Envoy", wasmFile)

	// Ports the bootstrap listens on are the container ports the Services use.
	listenPorts := map[int32]bool{}
	for _, l := range bs.GetStaticResources().GetListeners() {
		listenPorts[int32(l.GetAddress().GetSocketAddress().GetPortValue())] = true
	}
	for _, p := range envoyC.Ports {
		assert.True(t, listenPorts[p.ContainerPort], "container port %s (%d) has no Envoy listener", p.Name, p.ContainerPort)
	}
	var receiverPort uint32
	for _, p := range plugins {
		if p.Config.Role == config.RoleReceiver {
			receiverPort = p.Listener.GetAddress().GetSocketAddress().GetPortValue()
		}
	}
	push := service(t, b, pushService)
	assert.Equal(t, corev1.ClusterIPNone, push.Spec.ClusterIP, "the push Service is headless so agents reach every replica")
	require.Len(t, push.Spec.Ports, 1)
	assert.True(t, containerPortNumber(envoyC, push.Spec.Ports[0].TargetPort) == int32(receiverPort),
		"the push Service targets the receiver listener (%d)", receiverPort)
	client := service(t, b, gatewayServce)
	require.Len(t, client.Spec.Ports, 1)
	assert.Equal(t, int32(80), client.Spec.Ports[0].Port)
	assert.Equal(t, int32(10000), containerPortNumber(envoyC, client.Spec.Ports[0].TargetPort))
}

func checkAgent(t *testing.T, b *built) {
	ds := b.daemonSet(t, agentName)
	spec := ds.Spec.Template.Spec
	require.Len(t, spec.Containers, 1)
	c := spec.Containers[0]

	nodeName := slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool {
		return e.Name == "NODE_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName"
	})
	assert.True(t, nodeName, "NODE_NAME from the downward API")
	require.NotNil(t, c.ReadinessProbe)
	require.NotNil(t, c.LivenessProbe)
	assert.Equal(t, "/readyz", c.ReadinessProbe.HTTPGet.Path)
	assert.Equal(t, "/healthz", c.LivenessProbe.HTTPGet.Path)

	// The args, expanded as the kubelet would, must be a configuration the
	// agent itself accepts: every flag defined, every value parsed, the
	// combination valid. The agent's own parser decides, not a copy of it.
	const node = "node-1"
	args := expandArgs(t, c, map[string]string{"spec.nodeName": node, "metadata.namespace": ds.Namespace})
	cfg, err := metricsagent.ParseConfig(args, func(string) string { return "" }, io.Discard)
	require.NoError(t, err, "agent args %v", args)
	assert.Equal(t, node, cfg.NodeName)
	assert.Empty(t, cfg.Targets, "pods are discovered on Kubernetes")
	if cfg.InferencePool != "" {
		checkInferencePool(t, b, cfg)
	} else {
		assert.Equal(t, ds.Namespace, cfg.Namespace, "the agent watches its own namespace, where its Role applies")
	}

	// The token file is the Secret's key, mounted read-only.
	vol := mountedFrom(spec, c, cfg.PushTokenFile)
	require.NotEmpty(t, vol, "%s is not on a mounted volume", cfg.PushTokenFile)
	v := volume(spec, vol)
	require.NotNil(t, v.Secret, "the push token comes from a Secret volume")
	assert.True(t, slices.ContainsFunc(v.Secret.Items, func(k corev1.KeyToPath) bool {
		return k.Key == "token" && k.Path == filepath.Base(cfg.PushTokenFile)
	}), "%s is the Secret's key token", cfg.PushTokenFile)

	// --envoy-dns names the headless push Service and its port; the push path
	// is the receiver's.
	push := service(t, b, pushService)
	assert.Equal(t, fmt.Sprintf("%s.%s.svc.cluster.local:%d", push.Name, push.Namespace, push.Spec.Ports[0].Port), cfg.EnvoyDNS)
	assert.Equal(t, config.DefaultReceiverPath, cfg.PushPath)

	// The agent listens where its probes and port point.
	assert.Equal(t, fmt.Sprintf(":%d", containerPortNumber(c, c.ReadinessProbe.HTTPGet.Port)), cfg.Listen)

	if cfg.InferencePool != "" {
		return // checkInferencePool checked the pods
	}
	// In a build with vLLM pods (the demo), the selector finds them and the
	// metrics port is theirs.
	sel, err := labels.Parse(cfg.PodSelector)
	require.NoError(t, err)
	for _, w := range b.workloads() {
		if !sel.Matches(labels.Set(w.template.Labels)) {
			continue
		}
		assert.True(t, slices.ContainsFunc(w.template.Spec.Containers, func(c corev1.Container) bool {
			return slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool {
				return fmt.Sprint(p.ContainerPort) == cfg.MetricsPort || p.Name == cfg.MetricsPort
			})
		}), "--metrics-port %s is not a port of %s", cfg.MetricsPort, w.name)
	}
}

// checkInferencePool: the pool --inference-pool names is in the build; its
// selector picks workloads that serve every target port; the agent's Roles
// in the pool's namespace let it read the pool's objects; and the
// objectives and rewrites are all accepted into a table whose targets the
// pool's pods serve.
func checkInferencePool(t *testing.T, b *built, cfg metricsagent.Config) {
	ns, name, err := metricsagent.ParsePoolName(cfg.InferencePool)
	require.NoError(t, err)
	i := slices.IndexFunc(b.pools, func(p *metricsagent.InferencePool) bool { return p.Namespace == ns && p.Name == name })
	require.GreaterOrEqual(t, i, 0, "%s: no InferencePool %s", b.dir, cfg.InferencePool)
	pool := b.pools[i]
	sel := labels.SelectorFromSet(pool.Spec.Selector.MatchLabels)
	var served []string
	matched := 0
	for _, w := range b.workloads() {
		if !sel.Matches(labels.Set(w.template.Labels)) {
			continue
		}
		matched++
		for _, port := range pool.Ports() {
			assert.True(t, slices.ContainsFunc(w.template.Spec.Containers, func(c corev1.Container) bool {
				return slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.ContainerPort == int32(port) })
			}), "target port %d is not a port of %s", port, w.name)
		}
		for _, c := range w.template.Spec.Containers {
			if slices.Contains(flagNames(c.Args), "adapters") {
				served = append(served, strings.Split(flagValue(t, c.Args, "adapters"), ",")...)
				served = append(served, flagValue(t, c.Args, "model"))
			}
		}
	}
	assert.Positive(t, matched, "the pool's selector %s picks no workload", sel)

	can := func(group, resource, verb string) bool {
		for _, rb := range b.bindings {
			if rb.Namespace != ns || !slices.ContainsFunc(rb.Subjects, func(s rbacv1.Subject) bool { return s.Name == agentName }) {
				continue
			}
			for _, r := range b.roles {
				if r.Name == rb.RoleRef.Name && r.Namespace == ns && slices.ContainsFunc(r.Rules, func(rule rbacv1.PolicyRule) bool {
					return slices.Contains(rule.APIGroups, group) && slices.Contains(rule.Resources, resource) && slices.Contains(rule.Verbs, verb)
				}) {
					return true
				}
			}
		}
		return false
	}
	for _, gr := range [][2]string{{"", "pods"}, {"inference.networking.k8s.io", "inferencepools"}, {"llm-d.ai", "inferenceobjectives"}, {"llm-d.ai", "inferencemodelrewrites"}} {
		for _, verb := range []string{"list", "watch"} {
			assert.True(t, can(gr[0], gr[1], verb), "the agent may not %s %s in %s", verb, gr[1], ns)
		}
	}
	if cfg.WriteStatus {
		assert.True(t, can("llm-d.ai", "inferenceobjectives/status", "update"), "--write-status without the permission")
		assert.True(t, can("llm-d.ai", "inferencemodelrewrites/status", "update"), "--write-status without the permission")
	}

	var poolNames []string
	for _, p := range b.pools {
		if p.Namespace == ns {
			poolNames = append(poolNames, p.Name)
		}
	}
	var in metricsagent.TableInput
	in.PoolNamespace, in.PoolName, in.Pools = ns, name, poolNames
	for _, js := range b.inferenceJS {
		if strings.Contains(string(js), `"kind":"InferenceObjective"`) {
			in.Objectives = append(in.Objectives, js)
		} else {
			in.Rewrites = append(in.Rewrites, js)
		}
	}
	res := metricsagent.BuildTable(in, wire.ConfigLimits{})
	require.Len(t, res.Verdicts, b.objectives+b.rewrites, "every example object names the pool")
	for _, v := range res.Verdicts {
		assert.True(t, v.Accepted, "%s: %s %s", v.ID(), v.Reason, v.Message)
		assert.Empty(t, v.Conflicts, v.ID())
	}
	for _, rw := range res.Table.Rewrites {
		for _, tg := range rw.Targets {
			assert.Contains(t, served, tg.Model, "rewrite target %s of %s is not served by the pool's pods", tg.Model, rw.Model)
		}
	}
}

// expandArgs substitutes $(VAR) in c's args the way the kubelet does, with
// env vars from literal values or from the downward API fields given.
func expandArgs(t *testing.T, c corev1.Container, fields map[string]string) []string {
	env := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = e.Value
		case e.ValueFrom.FieldRef != nil:
			v, ok := fields[e.ValueFrom.FieldRef.FieldPath]
			require.True(t, ok, "no test value for field %s", e.ValueFrom.FieldRef.FieldPath)
			env[e.Name] = v
		}
	}
	varRef := regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)
	var out []string
	for _, a := range c.Args {
		out = append(out, varRef.ReplaceAllStringFunc(a, func(m string) string {
			v, ok := env[m[2:len(m)-1]]
			require.True(t, ok, "%s is not an env var of %s", m, c.Name)
			return v
		}))
	}
	return out
}

func service(t *testing.T, b *built, name string) *corev1.Service {
	for _, s := range b.services {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("%s: no Service %s", b.dir, name)
	return nil
}

func volume(spec corev1.PodSpec, name string) corev1.Volume {
	for _, v := range spec.Volumes {
		if v.Name == name {
			return v
		}
	}
	return corev1.Volume{}
}

// mountedFrom returns the volume holding path in container c ("" if none).
func mountedFrom(spec corev1.PodSpec, c corev1.Container, path string) string {
	best, bestLen := "", -1
	for _, m := range c.VolumeMounts {
		dir := strings.TrimSuffix(m.MountPath, "/") + "/"
		if strings.HasPrefix(path, dir) && len(dir) > bestLen {
			best, bestLen = m.Name, len(dir)
		}
	}
	return best
}

// fileInPod reads path as container c would see it, from a ConfigMap volume.
func fileInPod(t *testing.T, b *built, spec corev1.PodSpec, c corev1.Container, path string) []byte {
	vol := mountedFrom(spec, c, path)
	require.NotEmpty(t, vol, "%s is on no volume", path)
	v := volume(spec, vol)
	require.NotNil(t, v.ConfigMap, "%s must come from a ConfigMap", path)
	for _, m := range c.VolumeMounts {
		if m.Name != vol {
			continue
		}
		key := strings.TrimPrefix(path, strings.TrimSuffix(m.MountPath, "/")+"/")
		for _, cm := range b.configMaps {
			if cm.Name == v.ConfigMap.Name {
				data, ok := cm.Data[key]
				require.True(t, ok, "ConfigMap %s has no key %s", cm.Name, key)
				return []byte(data)
			}
		}
	}
	t.Fatalf("no ConfigMap %s", v.ConfigMap.Name)
	return nil
}

func containerPortNumber(c corev1.Container, p intstr.IntOrString) int32 {
	if p.Type == intstr.Int {
		return p.IntVal
	}
	for _, cp := range c.Ports {
		if cp.Name == p.StrVal {
			return cp.ContainerPort
		}
	}
	return -1
}

// flagNames returns the names of --flag / --flag=value arguments.
func flagNames(args []string) []string {
	var out []string
	for _, a := range args {
		if !strings.HasPrefix(a, "-") {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		out = append(out, name)
	}
	return out
}

func flagValue(t *testing.T, args []string, name string) string {
	for i, a := range args {
		trimmed := strings.TrimLeft(a, "-")
		if !strings.HasPrefix(a, "-") {
			continue
		}
		if k, v, ok := strings.Cut(trimmed, "="); ok && k == name {
			return v
		}
		if trimmed == name && i+1 < len(args) {
			return args[i+1]
		}
	}
	t.Fatalf("no --%s in %v", name, args)
	return ""
}

// TestBootstrapConfigMapMatchesLocal keeps the plugin configurations of the
// Kubernetes bootstrap and envoy/envoy.yaml identical, so the demo models and
// every setting documented for the local run hold in the cluster too.
func TestBootstrapConfigMapMatchesLocal(t *testing.T) {
	load := func(path string) map[config.Role]*config.Config {
		doc, err := os.ReadFile(path)
		require.NoError(t, err)
		b, err := bootstrap.Load(doc)
		require.NoError(t, err)
		plugins, err := envoy.Plugins(b)
		require.NoError(t, err)
		out := map[config.Role]*config.Config{}
		for _, p := range plugins {
			out[p.Config.Role] = p.Config
		}
		return out
	}
	assert.Equal(t, load("../envoy/envoy.yaml"), load("k8s/base/envoy.yaml"))
}

// TestDemoSimulatorsServeTheConfiguredModels: every model name the plugin
// routes (directly or as a traffic-split target) is served by the demo's
// simulated replicas, whose flags exist in bin/vllm-sim.
func TestDemoSimulatorsServeTheConfiguredModels(t *testing.T) {
	b := build(t, "k8s/overlays/demo")
	sim := b.deployment(t, "vllm-sim")
	require.Len(t, sim.Spec.Template.Spec.Containers, 1)
	args := sim.Spec.Template.Spec.Containers[0].Args
	known := simFlags(t)
	for _, name := range flagNames(args) {
		assert.Contains(t, known, name, "vllm-sim flag --%s is not defined by bin/vllm-sim", name)
	}
	served := append([]string{flagValue(t, args, "model")}, strings.Split(flagValue(t, args, "adapters"), ",")...)

	doc, err := os.ReadFile("k8s/base/envoy.yaml")
	require.NoError(t, err)
	bs, err := bootstrap.Load(doc)
	require.NoError(t, err)
	plugins, err := envoy.Plugins(bs)
	require.NoError(t, err)
	for _, p := range plugins {
		for _, m := range p.Config.Models {
			if len(m.Targets) == 0 {
				assert.Contains(t, served, m.Name, "model %s is routed but not served", m.Name)
			}
			for _, tg := range m.Targets {
				assert.Contains(t, served, tg.Name, "target %s of %s is not served", tg.Name, m.Name)
			}
		}
	}
	assert.Equal(t, "4", flagValue(t, args, "max-loras"))
	assert.Equal(t, int32(4), *sim.Spec.Replicas)
}

// TestIstioAndEnvoyGatewayExamples checks the CRD examples, which have no
// k8s.io/api types: they are decoded as maps, and the Envoy configuration
// inside them strictly into go-control-plane types.
func TestIstioAndEnvoyGatewayExamples(t *testing.T) {
	byKind := map[string][]map[string]any{}
	for _, m := range allManifests(t) {
		if !isCRD(m.kind) {
			continue
		}
		var obj map[string]any
		require.NoError(t, yaml.UnmarshalStrict(m.doc, &obj), m.file)
		byKind[m.kind] = append(byKind[m.kind], obj)
	}

	t.Run("EnvoyFilter", func(t *testing.T) {
		efs := byKind["networking.istio.io/v1alpha3/EnvoyFilter"]
		require.Len(t, efs, 1)
		checkEnvoyFilter(t, efs[0])
	})
	t.Run("WasmPlugin", func(t *testing.T) {
		wps := byKind["extensions.istio.io/v1alpha1/WasmPlugin"]
		require.Len(t, wps, 1)
		spec := wps[0]["spec"].(map[string]any)
		assert.Equal(t, "oci://"+pluginImage, spec["url"])
		assert.Equal(t, "FAIL_CLOSE", spec["failStrategy"])
		assert.NotEmpty(t, spec["phase"])
		cfg := decodePluginConfig(t, spec["pluginConfig"])
		assert.Equal(t, config.RoleRouter, cfg.Role)
		env := spec["vmConfig"].(map[string]any)["env"].([]any)[0].(map[string]any)
		assert.Equal(t, tokenEnv, env["name"])
		assert.Equal(t, "HOST", env["valueFrom"])
	})
	t.Run("EnvoyExtensionPolicy", func(t *testing.T) {
		roles := map[config.Role]bool{}
		for _, p := range byKind["gateway.envoyproxy.io/v1alpha1/EnvoyExtensionPolicy"] {
			for _, w := range p["spec"].(map[string]any)["wasm"].([]any) {
				w := w.(map[string]any)
				assert.Equal(t, "wasm-epp", w["rootID"])
				assert.Equal(t, false, w["failOpen"])
				code := w["code"].(map[string]any)
				assert.Equal(t, "Image", code["type"])
				assert.Equal(t, pluginImage, code["image"].(map[string]any)["url"])
				assert.Contains(t, w["env"].(map[string]any)["hostKeys"], tokenEnv)
				roles[decodePluginConfig(t, w["config"]).Role] = true
			}
		}
		assert.Equal(t, map[config.Role]bool{config.RoleRouter: true, config.RoleReceiver: true}, roles)
	})
	t.Run("EnvoyPatchPolicy", func(t *testing.T) {
		pps := byKind["gateway.envoyproxy.io/v1alpha1/EnvoyPatchPolicy"]
		require.Len(t, pps, 1)
		sets := map[string]any{}
		var cluster map[string]any
		for _, jp := range pps[0]["spec"].(map[string]any)["jsonPatches"].([]any) {
			op := jp.(map[string]any)["operation"].(map[string]any)
			if op["path"] == "" {
				cluster = op["value"].(map[string]any)
				continue
			}
			sets[op["path"].(string)] = op["value"]
		}
		assert.Equal(t, true, sets["/allow_on_headers_stop_iteration"])
		assert.Equal(t, "FAIL_RELOAD", sets["/failure_policy"])
		assert.Equal(t, envoy.VMID, sets["/vm_id"])
		assert.Equal(t, "wasm_epp_endpoints", sets["/cluster"])
		assert.Equal(t, "0s", sets["/timeout"])
		c := &clusterv3.Cluster{}
		protoFromMap(t, cluster, c)
		assert.Equal(t, config.DefaultDestinationHeader, c.GetOriginalDstLbConfig().GetHttpHeaderName())
	})
}

// pluginImage is the plugin image every example and manifest refers to.
const pluginImage = "wasm-epp/plugin:dev"

func decodePluginConfig(t *testing.T, v any) *config.Config {
	t.Helper()
	js, err := json.Marshal(v)
	require.NoError(t, err)
	cfg, err := config.Decode(js)
	require.NoError(t, err)
	return cfg
}

func protoFromMap(t *testing.T, m map[string]any, msg proto.Message) {
	t.Helper()
	js, err := json.Marshal(m)
	require.NoError(t, err)
	if _, typed := m["@type"]; typed {
		// A typed_config: decode the Any, then require the expected type.
		a := &anypb.Any{}
		require.NoError(t, protojson.UnmarshalOptions{}.Unmarshal(js, a), string(js))
		require.NoError(t, a.UnmarshalTo(msg), a.GetTypeUrl())
	} else {
		require.NoError(t, protojson.UnmarshalOptions{}.Unmarshal(js, msg), string(js))
	}
	if v, ok := msg.(interface{ ValidateAll() error }); ok {
		require.NoError(t, v.ValidateAll())
	}
}

func checkEnvoyFilter(t *testing.T, ef map[string]any) {
	wasms := map[string]*wasmfilterv3.Wasm{}
	var clusters []*clusterv3.Cluster
	var listeners []*listenerv3.Listener
	var inserted []string
	for _, p := range ef["spec"].(map[string]any)["configPatches"].([]any) {
		p := p.(map[string]any)
		patch := p["patch"].(map[string]any)
		value := patch["value"].(map[string]any)
		switch p["applyTo"] {
		case "EXTENSION_CONFIG":
			require.Equal(t, "ADD", patch["operation"], "istiod applies only ADD to extension configs")
			w := &wasmfilterv3.Wasm{}
			protoFromMap(t, value["typed_config"].(map[string]any), w)
			wasms[value["name"].(string)] = w
		case "CLUSTER":
			c := &clusterv3.Cluster{}
			protoFromMap(t, value, c)
			clusters = append(clusters, c)
		case "LISTENER":
			l := &listenerv3.Listener{}
			protoFromMap(t, value, l)
			listeners = append(listeners, l)
		case "HTTP_FILTER":
			assert.Equal(t, "INSERT_BEFORE", patch["operation"])
			inserted = append(inserted, value["name"].(string))
		}
	}
	require.Len(t, wasms, 2)
	roles := map[config.Role]string{}
	var vm *wasmv3.VmConfig
	for name, w := range wasms {
		pc := w.GetConfig()
		assert.True(t, pc.GetAllowOnHeadersStopIteration().GetValue(), name)
		assert.Contains(t, []wasmv3.FailurePolicy{wasmv3.FailurePolicy_FAIL_CLOSED, wasmv3.FailurePolicy_FAIL_RELOAD}, pc.GetFailurePolicy(), name)
		assert.Equal(t, "oci://"+pluginImage, pc.GetVmConfig().GetCode().GetRemote().GetHttpUri().GetUri(), name)
		if vm == nil {
			vm = pc.GetVmConfig()
		}
		assert.True(t, proto.Equal(vm, pc.GetVmConfig()), "%s: router and receiver must share vm_id, code and environment", name)
		s := &wrapperspb.StringValue{}
		require.NoError(t, pc.GetConfiguration().UnmarshalTo(s))
		cfg, err := config.Decode([]byte(s.GetValue()))
		require.NoError(t, err, name)
		roles[cfg.Role] = name
		if cfg.Role == config.RoleRouter {
			require.Len(t, clusters, 1)
			assert.Equal(t, cfg.DestinationHeader, clusters[0].GetOriginalDstLbConfig().GetHttpHeaderName())
			assert.Equal(t, clusterv3.Cluster_ORIGINAL_DST, clusters[0].GetType())
		}
	}
	assert.Equal(t, envoy.VMID, vm.GetVmId())
	assert.Contains(t, vm.GetEnvironmentVariables().GetHostEnvKeys(), tokenEnv)
	require.Contains(t, roles, config.RoleRouter)
	require.Contains(t, roles, config.RoleReceiver)
	assert.Equal(t, []string{roles[config.RoleRouter]}, inserted, "the router plugin is inserted into the gateway's HTTP chain")

	require.Len(t, listeners, 1, "the push listener")
	var discovered []string
	for _, fc := range listeners[0].GetFilterChains() {
		for _, f := range fc.GetFilters() {
			hcm := &hcmv3.HttpConnectionManager{}
			require.NoError(t, f.GetTypedConfig().UnmarshalTo(hcm))
			for _, hf := range hcm.GetHttpFilters() {
				if hf.GetConfigDiscovery() != nil {
					discovered = append(discovered, hf.GetName())
				}
			}
			for _, vh := range hcm.GetRouteConfig().GetVirtualHosts() {
				for _, r := range vh.GetRoutes() {
					assert.NotNil(t, r.GetDirectResponse(), "push routes are answered locally")
				}
			}
		}
	}
	assert.Equal(t, []string{roles[config.RoleReceiver]}, discovered)
}

// TestImagesScriptPrints runs build/images.sh in --print mode: it must name
// the four images and build nothing.
func TestImagesScriptPrints(t *testing.T) {
	out, err := runCommand(t, "..", "bash", "build/images.sh", "--print")
	require.NoError(t, err, string(out))
	for _, want := range []string{
		"-f build/Dockerfile -t wasm-epp/metricsagent:dev .",
		"-f build/vllm-sim.Dockerfile -t wasm-epp/vllm-sim:dev .",
		"-f build/plugin.Dockerfile -t " + pluginImage + " bin",
		"-f build/plugin-installer.Dockerfile -t wasm-epp/plugin-installer:dev bin",
	} {
		assert.True(t, bytes.Contains(out, []byte(want)), "missing %q in:\n%s", want, out)
	}
}
