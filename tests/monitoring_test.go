package tests

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"rmem/tests/internal/memdtest"
)

// TestMonitoring: the scrape config, alerting rules and Grafana dashboard
// in configs/ against live daemons. promtool checks the config and the
// rules and runs the rules' tests; a real Prometheus server scrapes a memd
// and a memagent serve --metrics-listen with the shipped scrape config
// (its targets pointed at them) while programs are paged; every rmem_
// metric that the dashboard's and the rules' expressions use reaches it,
// and every dashboard expression evaluates.
func TestMonitoring(t *testing.T) {
	maNeeds(t)
	promtool, err1 := exec.LookPath("promtool")
	prom, err2 := exec.LookPath("prometheus")
	if err1 != nil || err2 != nil {
		t.Skip("no promtool or prometheus: install Debian's prometheus package (.ci/run does)")
	}
	cfgDir, err := filepath.Abs("../configs/prometheus")
	if err != nil {
		t.Fatal(err)
	}
	run := func(dir, bin string, args ...string) string {
		cmd := exec.Command(bin, args...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", filepath.Base(bin), strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	run(cfgDir, promtool, "check", "config", "prometheus.yml")
	run(cfgDir, promtool, "test", "rules", "rmem-alerts_test.yml")

	// The metrics the dashboard and the rules use.
	dash, err := os.ReadFile("../configs/grafana/rmem-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var exprs []string
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				if s, ok := x.(string); ok && k == "expr" {
					exprs = append(exprs, s)
				} else {
					walk(x)
				}
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	var d any
	if err := json.Unmarshal(dash, &d); err != nil {
		t.Fatalf("the dashboard: %v", err)
	}
	walk(d)
	dashExprs := len(exprs)
	rules, err := os.ReadFile(filepath.Join(cfgDir, "rmem-alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	exprs = append(exprs, string(rules)) // names only: the whole file will do
	strs := regexp.MustCompile(`"(\\.|[^"\\])*"|'[^']*'`)
	want := map[string]bool{}
	for _, e := range exprs {
		for _, n := range regexp.MustCompile(`\brmem_[a-z0-9_]+`).FindAllString(strs.ReplaceAllString(e, `""`), -1) {
			want[regexp.MustCompile(`_(bucket|sum|count)$`).ReplaceAllString(n, "")] = true
		}
	}
	if dashExprs < 10 || len(want) < 15 {
		t.Fatalf("%d dashboard expressions, %d metrics: the dashboard or the rules were not read", dashExprs, len(want))
	}

	// Live daemons, programs paged, and Prometheus scraping them.
	bins := maBuild(t)
	memagent := filepath.Join(bins, "memagent")
	p := maStartPool(t, 1)
	metrics := memdtest.FreeAddr(t)
	a := maServe(t, memagent, p, "--metrics-listen", metrics)
	prog := exec.Command(memagent, "run", "--socket", a.socket, "--", "sh", "-c", "sleep 60")
	prog.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := prog.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { syscall.Kill(-prog.Process.Pid, syscall.SIGKILL); prog.Wait() }()
	r := maExec(t, nil, memagent, "run", "--socket", a.socket, "--", filepath.Join(bins, "pattern"), "64") // evictions, write-backs, misses
	maCheckExit(t, r, fmt.Sprintf("written %d pages\nchecksum %016x\n", 64<<8, maSum(64<<8*512, 0)))

	dir := t.TempDir()
	cfg, err := os.ReadFile(filepath.Join(cfgDir, "prometheus.yml"))
	if err != nil {
		t.Fatal(err)
	}
	memdAddr := strings.TrimPrefix(p.url, "http://")
	c := strings.NewReplacer(`"127.0.0.1:7470"`, `"`+memdAddr+`"`, `"127.0.0.1:7481"`, `"`+metrics+`"`,
		"scrape_interval: 15s", "scrape_interval: 1s", "- rmem-alerts.yml", "- "+filepath.Join(cfgDir, "rmem-alerts.yml")).Replace(string(cfg))
	if !strings.Contains(c, memdAddr) || !strings.Contains(c, metrics) {
		t.Fatalf("the scrape config's targets were not found to point at the daemons:\n%s", c)
	}
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(c), 0o644); err != nil {
		t.Fatal(err)
	}
	web := memdtest.FreeAddr(t)
	ps := memdtest.Start(t, "prometheus", prom, "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address="+web)
	query := func(q string) ([]map[string]any, error) {
		resp, err := http.Get("http://" + web + "/api/v1/query?query=" + url.QueryEscape(q))
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		var out struct {
			Status string `json:"status"`
			Error  string `json:"error"`
			Data   struct {
				Result []map[string]any `json:"result"`
			} `json:"data"`
		}
		if err := json.Unmarshal(body, &out); err != nil {
			return nil, fmt.Errorf("%s: %s", resp.Status, body)
		}
		if out.Status != "success" {
			return nil, fmt.Errorf("%s: %s", q, out.Error)
		}
		return out.Data.Result, nil
	}
	defer http.DefaultClient.CloseIdleConnections()
	memdtest.Eventually(t, 60*time.Second, "Prometheus scraping both daemons", func() error {
		if ps.Exited() {
			t.Fatalf("prometheus exited:\n%s", ps.Output())
		}
		res, err := query(`sum by (job) (up)`)
		if err != nil {
			return err
		}
		up := map[string]string{}
		for _, r := range res {
			v := r["value"].([]any)
			up[r["metric"].(map[string]any)["job"].(string)] = v[1].(string)
		}
		if up["memd"] != "1" || up["memagent"] != "1" {
			return fmt.Errorf("up: %v", up)
		}
		return nil
	})
	var have map[string]bool
	memdtest.Eventually(t, 30*time.Second, "every metric the dashboard and the rules use in Prometheus", func() error {
		res, err := query(`count by (__name__) ({__name__=~"rmem_.+"})`)
		if err != nil {
			return err
		}
		have = map[string]bool{}
		for _, r := range res {
			n := r["metric"].(map[string]any)["__name__"].(string)
			have[regexp.MustCompile(`_(bucket|sum|count)$`).ReplaceAllString(n, "")] = true
		}
		var missing []string
		for n := range want {
			if !have[n] {
				missing = append(missing, n)
			}
		}
		sort.Strings(missing)
		if len(missing) > 0 {
			return fmt.Errorf("not scraped: %s", strings.Join(missing, " "))
		}
		return nil
	})
	for _, e := range exprs[:dashExprs] {
		if _, err := query(e); err != nil {
			t.Errorf("a dashboard expression does not evaluate: %v", err)
		}
	}
	t.Logf("%d dashboard expressions and the rules use %d metrics, all scraped", dashExprs, len(want))
}
