package main

import (
	"encoding/json"
	"fmt"
	"io"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// version is set at build time with -ldflags "-X main.version=v1.2.3";
// otherwise the module version or VCS revision from the build info is used.
var version = ""

func versionString() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			return bi.Main.Version
		}
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				return "dev-" + s.Value[:12]
			}
		}
	}
	return "dev"
}

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "moeprep",
		Short: "Prepare Mixture-of-Experts checkpoints offline for fast serving, and prove them equivalent",
		Long: `moeprep prepares Mixture-of-Experts LLM checkpoints (DeepSeek-V2/V3/R1, Kimi-K2,
Qwen2-MoE, Qwen3-MoE, Mixtral) once, offline, for serving engines: it stacks each
MoE layer's experts into contiguous tensors, fuses the shared expert into the
expert bank, folds routed_scaling_factor into the weights, and validates that
the prepared checkpoint computes the same function as the original.

Exit codes: 0 success, 1 a check found a problem, 2 bad usage or unreadable or
malformed input, 130 interrupted.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return fmt.Errorf("%s: %v (see '%s --help')", c.CommandPath(), err, c.CommandPath())
	})
	root.AddCommand(newVersionCmd(), newInspectCmd())
	for _, add := range extraCommands {
		root.AddCommand(add())
	}
	return root
}

// extraCommands lets each command file register itself.
var extraCommands []func() *cobra.Command

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print moeprep's version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintln(cmd.OutOrStdout(), "moeprep", versionString())
			return err
		},
	}
}

// exactArgs is cobra.ExactArgs with an error that says what the command takes.
func exactArgs(n int, what string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return fmt.Errorf("%s takes %s, got %d argument(s) (see '%s --help')", cmd.CommandPath(), what, len(args), cmd.CommandPath())
		}
		return nil
	}
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
