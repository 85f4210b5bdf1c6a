package main

// pod-targets: the target groups Prometheus's own Kubernetes service discovery (role: pod) builds
// for a Pod, from github.com/prometheus/prometheus/discovery/kubernetes at the version the
// operator's module requires. A test puts them in `static_configs`, so the operator's relabel rules
// run, unchanged, on exactly the `__meta_kubernetes_pod_*` labels a cluster's Prometheus would see.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"time"

	promclient "github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/prometheus/discovery/kubernetes"
	"github.com/prometheus/prometheus/discovery/targetgroup"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
)

// staticConfig is one entry of a Prometheus `static_configs` list.
type staticConfig struct {
	Targets []string          `json:"targets"`
	Labels  map[string]string `json:"labels"`
}

func podTargets(in io.Reader, out io.Writer) error {
	raw, err := io.ReadAll(in)
	if err != nil {
		return err
	}
	pod := &corev1.Pod{}
	if err := strictJSON(raw, pod); err != nil {
		return fmt.Errorf("pod: %w", err)
	}
	// The informer of a cluster that holds exactly this pod (the Discovery's own list-watch,
	// without an API server): a list, or a watch-list stream (the pod, then the bookmark that
	// ends the initial events, as the API server sends them), then nothing.
	pod.ResourceVersion = "1"
	lw := &cache.ListWatch{
		ListWithContextFunc: func(context.Context, metav1.ListOptions) (runtime.Object, error) {
			return &corev1.PodList{ListMeta: metav1.ListMeta{ResourceVersion: "1"}, Items: []corev1.Pod{*pod}}, nil
		},
		WatchFuncWithContext: func(_ context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			w := watch.NewFakeWithChanSize(2, false)
			if opts.SendInitialEvents != nil && *opts.SendInitialEvents {
				w.Add(pod.DeepCopy())
				w.Action(watch.Bookmark, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{
					ResourceVersion: "1", Annotations: map[string]string{metav1.InitialEventsAnnotationKey: "true"}}})
			}
			return w, nil
		},
	}
	informer := cache.NewSharedIndexInformer(lw, &corev1.Pod{}, 0, cache.Indexers{})
	events := promclient.NewCounterVec(promclient.CounterOpts{Name: "events_total"}, []string{"role", "event"})
	logger := slog.New(slog.DiscardHandler)
	d := kubernetes.NewPod(logger, informer, nil, nil, nil, nil, false, false, false, events)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	go informer.Run(ctx.Done())
	ch := make(chan []*targetgroup.Group, 1)
	go d.Run(ctx, ch)
	var groups []*targetgroup.Group
	select {
	case groups = <-ch:
	case <-ctx.Done():
		return fmt.Errorf("kubernetes pod discovery sent no target group in 30 s")
	}
	result := []staticConfig{}
	for _, tg := range groups {
		for _, t := range tg.Targets {
			labels := map[string]string{}
			for k, v := range tg.Labels {
				labels[string(k)] = string(v)
			}
			for k, v := range t {
				labels[string(k)] = string(v)
			}
			addr := labels["__address__"]
			delete(labels, "__address__")
			result = append(result, staticConfig{Targets: []string{addr}, Labels: labels})
		}
	}
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	return enc.Encode(result)
}
