//go:build deploy

package deploy

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// saMountPath is where the kubelet mounts the ServiceAccount's token, the
// API server's CA and the namespace, and where in-cluster config reads
// them.
const saMountPath = "/var/run/secrets/kubernetes.io/serviceaccount"

// apiAccessVolume is the volume the kubelet adds for them.
const apiAccessVolume = "kube-api-access"

// kubelet does for the pod what a kubelet would and podman kube play
// (4.3) does not: it mounts the ServiceAccount's token (from the
// TokenRequest API), the API server's CA and the namespace where
// in-cluster config looks, sets KUBERNETES_SERVICE_HOST and _PORT,
// resolves downward-API env (fieldRef), and fills Secret and ConfigMap
// volumes from the API server (podman would look them up in its own
// store, and ignores optional). The pod runs on the host's network, so
// that it reaches the API server and the simulators on loopback; podman
// 4.3 refuses containerPorts there (it takes them for port mappings),
// which on the host's network only document what the container listens
// on, so they are left out.
type kubelet struct {
	// reader reads the Secrets and ConfigMaps the pod mounts (the
	// kubelet's node credentials; the test's admin client).
	reader client.Reader
	// apiHost and apiPort are the API server's address.
	apiHost, apiPort string
	// caPEM is the API server's CA; token the ServiceAccount's token.
	caPEM []byte
	token string
	// dir receives the volumes' files.
	dir string
}

// podChanges records what pod changed, for checkOnlyKubeletChanges.
type podChanges struct {
	resolvedEnv   map[string]bool // container/env names whose fieldRef became a value
	filledVolumes map[string]bool // Secret and ConfigMap volumes that became host paths
}

// pod returns the Deployment as the kubelet would run it.
func (k *kubelet) pod(ctx context.Context, d *appsv1.Deployment) (*appsv1.Deployment, podChanges, error) {
	out := d.DeepCopy()
	ch := podChanges{resolvedEnv: map[string]bool{}, filledVolumes: map[string]bool{}}
	spec := &out.Spec.Template.Spec
	spec.HostNetwork = true
	access := filepath.Join(k.dir, apiAccessVolume)
	if err := writeFiles(access, map[string][]byte{
		"token": []byte(k.token), "ca.crt": k.caPEM, "namespace": []byte(d.Namespace),
	}, 0o644); err != nil {
		return nil, ch, err
	}
	dirType := corev1.HostPathDirectory
	spec.Volumes = append(spec.Volumes, corev1.Volume{Name: apiAccessVolume,
		VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: access, Type: &dirType}}})
	for i := range spec.Volumes {
		v := &spec.Volumes[i]
		files, mode, err := k.volumeFiles(ctx, d.Namespace, v)
		if err != nil {
			return nil, ch, err
		}
		if files == nil {
			continue
		}
		path := filepath.Join(k.dir, "volumes", v.Name)
		if err := writeFiles(path, files, mode); err != nil {
			return nil, ch, err
		}
		v.VolumeSource = corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: path, Type: &dirType}}
		ch.filledVolumes[v.Name] = true
	}
	for i := range spec.Containers {
		c := &spec.Containers[i]
		for j := range c.Env {
			e := &c.Env[j]
			if e.ValueFrom == nil || e.ValueFrom.FieldRef == nil {
				continue
			}
			switch e.ValueFrom.FieldRef.FieldPath {
			case "metadata.namespace":
				e.Value = d.Namespace
			default:
				return nil, ch, fmt.Errorf("container %s env %s: fieldRef %s is not emulated", c.Name, e.Name, e.ValueFrom.FieldRef.FieldPath)
			}
			e.ValueFrom = nil
			ch.resolvedEnv[c.Name+"/"+e.Name] = true
		}
		c.Ports = nil
		c.Env = append(c.Env, corev1.EnvVar{Name: "KUBERNETES_SERVICE_HOST", Value: k.apiHost},
			corev1.EnvVar{Name: "KUBERNETES_SERVICE_PORT", Value: k.apiPort})
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: apiAccessVolume, MountPath: saMountPath, ReadOnly: true})
	}
	return out, ch, nil
}

// volumeFiles reads a Secret or ConfigMap volume's files as the kubelet
// would write them (keys, or the items' paths); nil for other volumes. A
// missing optional source is an empty directory; a missing required one
// would keep the pod from starting.
func (k *kubelet) volumeFiles(ctx context.Context, ns string, v *corev1.Volume) (map[string][]byte, os.FileMode, error) {
	var (
		data     map[string][]byte
		items    []corev1.KeyToPath
		optional bool
		err      error
	)
	mode := corev1.SecretVolumeSourceDefaultMode
	switch {
	case v.Secret != nil:
		var s corev1.Secret
		err = k.reader.Get(ctx, client.ObjectKey{Namespace: ns, Name: v.Secret.SecretName}, &s)
		data, items = s.Data, v.Secret.Items
		optional = v.Secret.Optional != nil && *v.Secret.Optional
		if v.Secret.DefaultMode != nil {
			mode = *v.Secret.DefaultMode
		}
	case v.ConfigMap != nil:
		var c corev1.ConfigMap
		err = k.reader.Get(ctx, client.ObjectKey{Namespace: ns, Name: v.ConfigMap.Name}, &c)
		data, items = map[string][]byte{}, v.ConfigMap.Items
		for key, val := range c.Data {
			data[key] = []byte(val)
		}
		maps.Copy(data, c.BinaryData)
		optional = v.ConfigMap.Optional != nil && *v.ConfigMap.Optional
		if v.ConfigMap.DefaultMode != nil {
			mode = *v.ConfigMap.DefaultMode
		}
	default:
		return nil, 0, nil
	}
	switch {
	case apierrors.IsNotFound(err) && optional:
		return map[string][]byte{}, os.FileMode(mode), nil
	case err != nil:
		return nil, 0, fmt.Errorf("volume %s: %w", v.Name, err)
	}
	if len(items) == 0 {
		return data, os.FileMode(mode), nil
	}
	out := map[string][]byte{}
	for _, it := range items {
		val, ok := data[it.Key]
		if !ok && !optional {
			return nil, 0, fmt.Errorf("volume %s: key %s missing", v.Name, it.Key)
		}
		out[it.Path] = val
	}
	return out, os.FileMode(mode), nil
}

// writeFiles writes files into a fresh dir, readable by the container's
// non-root user as the kubelet's modes make them.
func writeFiles(dir string, files map[string][]byte, mode os.FileMode) error {
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return err
	}
	for name, data := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, data, mode); err != nil {
			return err
		}
		if err := os.Chmod(p, mode); err != nil {
			return err
		}
	}
	return nil
}

// checkOnlyKubeletChanges compares the installed Deployment (podSource) with the one
// given to podman and returns every difference that is not one of the
// kubelet's (podChanges, the API access volume and env, host network).
func checkOnlyKubeletChanges(installed, played *appsv1.Deployment, ch podChanges) ([]string, error) {
	a, err := runtime.DefaultUnstructuredConverter.ToUnstructured(installed)
	if err != nil {
		return nil, err
	}
	b, err := runtime.DefaultUnstructuredConverter.ToUnstructured(played)
	if err != nil {
		return nil, err
	}
	const pod = `^spec\.template\.spec\.`
	const container = pod + `containers\[name=([^\]]+)\]\.`
	allowed := []*regexp.Regexp{
		regexp.MustCompile(pod + `hostNetwork$`),
		regexp.MustCompile(container + `ports$`),
		regexp.MustCompile(pod + `volumes\[name=` + apiAccessVolume + `\]$`),
		regexp.MustCompile(container + `volumeMounts\[name=` + apiAccessVolume + `\]$`),
		regexp.MustCompile(container + `env\[name=KUBERNETES_SERVICE_(HOST|PORT)\]$`),
	}
	resolved := regexp.MustCompile(container + `env\[name=([^\]]+)\]\.(value|valueFrom)$`)
	filled := regexp.MustCompile(pod + `volumes\[name=([^\]]+)\]\.(secret|configMap|hostPath)$`)
	var diffs, unexpected []string
	diffPaths(a, b, "", &diffs)
	for _, p := range diffs {
		ok := slices.ContainsFunc(allowed, func(r *regexp.Regexp) bool { return r.MatchString(p) })
		if m := resolved.FindStringSubmatch(p); m != nil && ch.resolvedEnv[m[1]+"/"+m[2]] {
			ok = true
		}
		if m := filled.FindStringSubmatch(p); m != nil && ch.filledVolumes[m[1]] {
			ok = true
		}
		if !ok {
			unexpected = append(unexpected, p)
		}
	}
	return unexpected, nil
}

// diffPaths appends the paths where a and b differ; lists of objects with
// a name are matched by name.
func diffPaths(a, b any, path string, out *[]string) {
	am, aMap := a.(map[string]any)
	bm, bMap := b.(map[string]any)
	if aMap && bMap {
		keys := slices.Sorted(maps.Keys(am))
		for k := range bm {
			if _, ok := am[k]; !ok {
				keys = append(keys, k)
			}
		}
		for _, k := range keys {
			diffPaths(am[k], bm[k], strings.TrimPrefix(path+"."+k, "."), out)
		}
		return
	}
	al, aList := a.([]any)
	bl, bList := b.([]any)
	if aList && bList && named(al) && named(bl) {
		byName := func(l []any) map[string]any {
			m := map[string]any{}
			for _, e := range l {
				m[e.(map[string]any)["name"].(string)] = e
			}
			return m
		}
		an, bn := byName(al), byName(bl)
		names := slices.Sorted(maps.Keys(an))
		for n := range bn {
			if _, ok := an[n]; !ok {
				names = append(names, n)
			}
		}
		for _, n := range names {
			diffPaths(an[n], bn[n], path+"[name="+n+"]", out)
		}
		return
	}
	if !reflect.DeepEqual(a, b) {
		*out = append(*out, path)
	}
}

// named reports whether every element of l is an object with a name.
func named(l []any) bool {
	for _, e := range l {
		m, ok := e.(map[string]any)
		if !ok {
			return false
		}
		if _, ok := m["name"].(string); !ok {
			return false
		}
	}
	return true
}
