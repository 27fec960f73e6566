package node

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestSplitRuleKeepsQuotedWordsTogether(t *testing.T) {
	for _, c := range []struct {
		line string
		want []string
	}{
		{`-N KUBE-SERVICES`, []string{"-N", "KUBE-SERVICES"}},
		{`-A INPUT -m comment --comment "kubernetes health check service ports" -j KUBE-NODEPORTS`,
			[]string{"-A", "INPUT", "-m", "comment", "--comment", "kubernetes health check service ports", "-j", "KUBE-NODEPORTS"}},
		{`-A X -m comment --comment "a \"quoted\" word" -j RETURN`, []string{"-A", "X", "-m", "comment", "--comment", `a "quoted" word`, "-j", "RETURN"}},
		{`-A X -m comment --comment "" -j RETURN`, []string{"-A", "X", "-m", "comment", "--comment", "", "-j", "RETURN"}},
	} {
		assert.Equal(t, c.want, splitRule(c.line), c.line)
	}
}

func TestJumpsToOwned(t *testing.T) {
	assert.True(t, jumpsToOwned(splitRule(`-A FORWARD -j KUBE-FORWARD`)))
	assert.True(t, jumpsToOwned(splitRule(`-A FORWARD -j EP-CLUSTER-ISOLATION`)))
	assert.True(t, jumpsToOwned(splitRule(`-A POSTROUTING -s 10.244.0.0/24 -j CNI-abc`)))
	assert.False(t, jumpsToOwned(splitRule(`-A FORWARD -j DOCKER-USER`)))
	assert.False(t, jumpsToOwned(splitRule(`-A INPUT -m comment --comment "-j KUBE-X" -j ACCEPT`)))
}
