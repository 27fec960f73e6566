// Package fakecompute is a local HTTP server speaking the Compute Engine
// REST API for the four calls the gcp provider makes (instances insert,
// get, delete, aggregatedList), so the real client library can be tested
// here where GCP cannot be reached. It keeps the protocol's shape: zone-
// scoped paths, Operation answers, errors in Google's JSON format, an
// instance that boots from PROVISIONING to RUNNING over successive Gets,
// and aggregated pages keyed by zone. Every call is recorded.
package fakecompute

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Call is one recorded request.
type Call struct {
	Method, Path, Query string
	Body                map[string]any
}

// Server is the fake.
type Server struct {
	*httptest.Server
	mu        sync.Mutex
	instances map[string]map[string]any // "zone/name" -> instance JSON
	gets      map[string]int
	calls     []Call
	// PageSize of aggregatedList answers (small, to force several pages).
	PageSize int
	// BootAfterGets: Gets an instance answers PROVISIONING before RUNNING.
	BootAfterGets int
	// NextInsertError, when set, answers the next Insert with this status
	// and Google error body, once.
	nextInsertErr *apiError
	nextIP        int
}

type apiError struct {
	Code            int
	Reason, Message string
}

// New starts a fake.
func New() *Server {
	s := &Server{instances: map[string]map[string]any{}, gets: map[string]int{}, PageSize: 2, BootAfterGets: 2}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	return s
}

// FailNextInsert makes the next Insert answer code with reason and message.
func (s *Server) FailNextInsert(code int, reason, message string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nextInsertErr = &apiError{code, reason, message}
}

// Calls returns every request so far.
func (s *Server) Calls() []Call {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Call(nil), s.calls...)
}

// Put stores an instance as the API would hold it (for GC tests).
func (s *Server) Put(zone string, inst map[string]any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := inst["creationTimestamp"]; !ok {
		inst["creationTimestamp"] = time.Now().UTC().Format(time.RFC3339)
	}
	inst["zone"] = "projects/p/zones/" + zone
	s.instances[zone+"/"+inst["name"].(string)] = inst
}

// Len is the number of instances.
func (s *Server) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.instances)
}

var (
	zonePath = regexp.MustCompile(`^/compute/v1/projects/([^/]+)/zones/([^/]+)/instances(?:/([^/]+))?$`)
	aggPath  = regexp.MustCompile(`^/compute/v1/projects/([^/]+)/aggregated/instances$`)
)

func writeErr(w http.ResponseWriter, code int, reason, msg string) {
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{
		"code": code, "message": msg, "errors": []any{map[string]any{"domain": "global", "reason": reason, "message": msg}},
	}})
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	_ = json.NewEncoder(w).Encode(v)
}

func (s *Server) operation(project, zone, name, kind string) map[string]any {
	return map[string]any{
		"kind": "compute#operation", "id": strconv.FormatInt(time.Now().UnixNano(), 10), "name": "operation-" + strconv.FormatInt(time.Now().UnixNano(), 36),
		"operationType": kind, "status": "RUNNING", "progress": 0,
		"zone":       fmt.Sprintf("https://www.googleapis.com/compute/v1/projects/%s/zones/%s", project, zone),
		"targetLink": fmt.Sprintf("https://www.googleapis.com/compute/v1/projects/%s/zones/%s/instances/%s", project, zone, name),
		"selfLink":   fmt.Sprintf("https://www.googleapis.com/compute/v1/projects/%s/zones/%s/operations/op", project, zone),
	}
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	body := map[string]any{}
	if b, _ := io.ReadAll(r.Body); len(b) > 0 {
		_ = json.Unmarshal(b, &body)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, Call{Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery, Body: body})

	if m := aggPath.FindStringSubmatch(r.URL.Path); m != nil && r.Method == http.MethodGet {
		s.aggregated(w, r)
		return
	}
	m := zonePath.FindStringSubmatch(r.URL.Path)
	if m == nil {
		writeErr(w, http.StatusNotFound, "notFound", "unknown path "+r.URL.Path)
		return
	}
	project, zone, name := m[1], m[2], m[3]
	key := zone + "/" + name
	switch {
	case r.Method == http.MethodPost && name == "":
		if e := s.nextInsertErr; e != nil {
			s.nextInsertErr = nil
			writeErr(w, e.Code, e.Reason, e.Message)
			return
		}
		n, _ := body["name"].(string)
		key = zone + "/" + n
		if _, ok := s.instances[key]; ok {
			writeErr(w, http.StatusConflict, "alreadyExists", fmt.Sprintf("The resource 'projects/%s/zones/%s/instances/%s' already exists", project, zone, n))
			return
		}
		inst := body
		inst["kind"] = "compute#instance"
		inst["id"] = strconv.FormatInt(time.Now().UnixNano(), 10)
		inst["status"] = "PROVISIONING"
		inst["zone"] = fmt.Sprintf("https://www.googleapis.com/compute/v1/projects/%s/zones/%s", project, zone)
		inst["creationTimestamp"] = time.Now().UTC().Format(time.RFC3339)
		s.instances[key] = inst
		writeJSON(w, s.operation(project, zone, n, "insert"))
	case r.Method == http.MethodGet && name != "":
		inst, ok := s.instances[key]
		if !ok {
			writeErr(w, http.StatusNotFound, "notFound", fmt.Sprintf("The resource 'projects/%s/zones/%s/instances/%s' was not found", project, zone, name))
			return
		}
		s.gets[key]++
		if inst["status"] == "PROVISIONING" && s.gets[key] >= s.BootAfterGets {
			inst["status"] = "RUNNING"
			s.nextIP++
			// TEST-NET-3 documentation addresses: data in JSON, never dialled.
			ip := fmt.Sprintf("203.0.113.%d", s.nextIP)
			if nics, ok := inst["networkInterfaces"].([]any); ok && len(nics) > 0 {
				nic := nics[0].(map[string]any)
				nic["networkIP"] = fmt.Sprintf("10.128.0.%d", s.nextIP)
				if acs, ok := nic["accessConfigs"].([]any); ok && len(acs) > 0 {
					acs[0].(map[string]any)["natIP"] = ip
				}
			}
		}
		writeJSON(w, inst)
	case r.Method == http.MethodDelete && name != "":
		if _, ok := s.instances[key]; !ok {
			writeErr(w, http.StatusNotFound, "notFound", fmt.Sprintf("The resource 'projects/%s/zones/%s/instances/%s' was not found", project, zone, name))
			return
		}
		delete(s.instances, key)
		writeJSON(w, s.operation(project, zone, name, "delete"))
	default:
		writeErr(w, http.StatusBadRequest, "invalid", "unsupported "+r.Method+" "+r.URL.Path)
	}
}

var clause = regexp.MustCompile(`labels\.([a-z0-9_-]+)\s*=\s*"?([^"\s)]+)"?`)

// aggregated answers aggregatedList with the label filter applied, in
// pages of PageSize instances, keyed "zones/<zone>".
func (s *Server) aggregated(w http.ResponseWriter, r *http.Request) {
	want := map[string]string{}
	for _, m := range clause.FindAllStringSubmatch(r.URL.Query().Get("filter"), -1) {
		want[m[1]] = m[2]
	}
	keys := make([]string, 0, len(s.instances))
	for k := range s.instances {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var matched []string
	for _, k := range keys {
		labels, _ := s.instances[k]["labels"].(map[string]any)
		ok := true
		for lk, lv := range want {
			if fmt.Sprint(labels[lk]) != lv {
				ok = false
			}
		}
		if ok {
			matched = append(matched, k)
		}
	}
	start, _ := strconv.Atoi(r.URL.Query().Get("pageToken"))
	end := min(start+s.PageSize, len(matched))
	items := map[string]any{}
	for _, k := range matched[start:end] {
		zone := k[:strings.Index(k, "/")]
		scoped, _ := items["zones/"+zone].(map[string]any)
		if scoped == nil {
			scoped = map[string]any{"instances": []any{}}
			items["zones/"+zone] = scoped
		}
		scoped["instances"] = append(scoped["instances"].([]any), s.instances[k])
	}
	resp := map[string]any{"kind": "compute#instanceAggregatedList", "items": items}
	if end < len(matched) {
		resp["nextPageToken"] = strconv.Itoa(end)
	}
	writeJSON(w, resp)
}
