package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"regexp"
	"runtime/debug"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/term"

	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/internal/suggest"
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
		Long: `moeprep prepares Mixture-of-Experts LLM checkpoints once, offline, for serving
engines: it stacks each MoE layer's experts into contiguous tensors, fuses the
shared expert into the expert bank, folds routed_scaling_factor into the
weights, and validates that the prepared checkpoint computes the same function
as the original.

Model types: ` + wrapList(family.SupportedModelTypes(), 66, "  ") + `

Multimodal wrappers (the text model's MoE layers converted, the rest carried
byte for byte): ` + wrapList(family.SupportedWrappers(), 66, "  ") + `

Their text models saved alone (transformers' *ForCausalLM, or its base text
model where it has none): ` + wrapList(family.SupportedTextAlone(), 50, "  ") + `

Exit codes: 0 success, 1 a check found a problem, 2 bad usage or unreadable or
malformed input, 130 interrupted (SIGINT), 143 terminated (SIGTERM).`,
		Version:       versionString(),
		Args:          cobra.ArbitraryArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		// Reached only when no subcommand matched: no arguments, or an
		// unknown command. Both are usage errors (exit 2), with the
		// suggestion on the same line rather than cobra's paragraph.
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				fmt.Fprint(cmd.ErrOrStderr(), cmd.UsageString())
				return fmt.Errorf("no command given (see 'moeprep --help')")
			}
			msg := fmt.Sprintf("unknown command %q", args[0])
			if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
				msg += "; did you mean " + strings.Join(s, " or ") + "?"
			}
			return fmt.Errorf("%s (see 'moeprep --help')", msg)
		},
	}
	// cobra leaves the distance at 0 unless asked: "valdiate" then finds
	// nothing, though two letters are swapped.
	root.SuggestionsMinimumDistance = 2
	root.SetVersionTemplate("moeprep {{.Version}}\n")
	cobra.AddTemplateFunc("flagUsages", func(fs *pflag.FlagSet) string {
		return strings.TrimRight(fs.FlagUsagesWrapped(helpWidth()), " \n")
	})
	root.SetUsageTemplate(usageTemplate)
	root.SetHelpTemplate(helpTemplate)
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		msg := cleanFlagError(err)
		if s := flagSuggestion(c, err); s != "" {
			msg += "; did you mean " + s + "?"
		}
		if !c.HasParent() {
			// The root: the line already starts "moeprep: ".
			return fmt.Errorf("%s (see '%s --help')", msg, c.CommandPath())
		}
		return fmt.Errorf("%s: %s (see '%s --help')", commandName(c), msg, c.CommandPath())
	})
	root.AddCommand(commands()...)
	return root
}

// flagSuggestion is the command's flag closest to an unknown one (--layotu:
// --layout), within two edits (a swap counting one), or "".
func flagSuggestion(c *cobra.Command, err error) string {
	name, ok := strings.CutPrefix(err.Error(), "unknown flag: --")
	if !ok {
		return ""
	}
	best, bestD := "", 3
	c.Flags().VisitAll(func(f *pflag.Flag) {
		if f.Hidden || f.Deprecated != "" {
			return
		}
		if d := suggest.Distance(name, f.Name); d < bestD {
			best, bestD = "--"+f.Name, d
		}
	})
	return best
}

// cleanFlagError rewrites pflag's errors for people: `invalid argument
// "eight" for "--tp" flag: strconv.ParseInt: parsing "eight": invalid
// syntax` becomes `--tp "eight": not a whole number`.
func cleanFlagError(err error) string {
	msg := err.Error()
	m := flagParseErr.FindStringSubmatch(msg)
	if m == nil {
		return msg
	}
	what := "not a valid value"
	switch {
	case strings.Contains(m[3], "value out of range"):
		what = "out of range"
	case strings.HasPrefix(m[3], "strconv.ParseInt"), strings.HasPrefix(m[3], "strconv.ParseUint"):
		what = "not a whole number"
	case strings.HasPrefix(m[3], "strconv.ParseFloat"):
		what = "not a number"
	case strings.HasPrefix(m[3], "strconv.ParseBool"):
		what = "not true or false"
	}
	return fmt.Sprintf("%s %q: %s", m[2], m[1], what)
}

var flagParseErr = regexp.MustCompile(`^invalid argument "(.*)" for "(.*)" flag: (.*)$`)

// wrapList joins words with commas into lines of at most width characters,
// each after the first starting with indent.
func wrapList(words []string, width int, indent string) string {
	var b strings.Builder
	line := 0
	for i, w := range words {
		if i > 0 {
			b.WriteString(",")
			line++
			if line+1+len(w) > width {
				b.WriteString("\n" + indent)
				line = len(indent)
			} else {
				b.WriteString(" ")
				line++
			}
		}
		b.WriteString(w)
		line += len(w)
	}
	return b.String()
}

// commands are moeprep's commands, every one of them in this one list: a
// new command is a line here, not an init() in its own file whose place
// depends on the file's name. The order is the order they are added to the
// root; help lists them sorted by name whatever it is.
func commands() []*cobra.Command {
	return []*cobra.Command{
		newVersionCmd(),
		newInspectCmd(),
		newBenchCmd(),
		newConvertCmd(),
		newFuseSharedCmd(),
		newDemoCmd(),
		newFixtureCmd(),
		newValidateCmd(),
		newPlacementCmd(),
	}
}

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
			return fmt.Errorf("%s takes %s, got %s (see '%s --help')", commandName(cmd), what, argCount(len(args)), cmd.CommandPath())
		}
		return nil
	}
}

// helpWidth is the columns help is wrapped to: $COLUMNS, else the
// terminal's width, else 100; never under 60 (the flag names need room).
func helpWidth() int {
	if c, err := strconv.Atoi(os.Getenv("COLUMNS")); err == nil && c > 0 {
		return max(c, 60)
	}
	if w, _, err := term.GetSize(int(os.Stdout.Fd())); err == nil && w > 0 {
		return max(w, 60)
	}
	return 100
}

// usageTemplate is cobra's, with each flag's description wrapped to the
// terminal (cobra prints one line a flag, up to 400 columns).
const usageTemplate = `Usage:{{if .Runnable}}
  {{.UseLine}}{{end}}{{if .HasAvailableSubCommands}}
  {{.CommandPath}} [command]{{end}}{{if gt (len .Aliases) 0}}

Aliases:
  {{.NameAndAliases}}{{end}}{{if .HasExample}}

Examples:
{{.Example}}{{end}}{{if .HasAvailableSubCommands}}

Available Commands:{{range .Commands}}{{if (or .IsAvailableCommand (eq .Name "help"))}}
  {{rpad .Name .NamePadding }} {{.Short}}{{end}}{{end}}{{end}}{{if .HasAvailableLocalFlags}}

Flags:
{{flagUsages .LocalFlags}}{{end}}{{if .HasAvailableInheritedFlags}}

Global Flags:
{{flagUsages .InheritedFlags}}{{end}}{{if .HasAvailableSubCommands}}

Use "{{.CommandPath}} [command] --help" for more information about a command.{{end}}
`

// helpTemplate puts a command's one-line summary, usage, examples and flags
// on the first screen and its longer prose after them (fuse-shared's ran
// 35 lines before Usage); moeprep's own help keeps its overview first.
const helpTemplate = `{{if .HasParent}}{{.Short}}

{{if or .Runnable .HasSubCommands}}{{.UsageString}}{{end}}{{with .Long}}
{{. | trimTrailingWhitespaces}}
{{end}}{{else}}{{with (or .Long .Short)}}{{. | trimTrailingWhitespaces}}

{{end}}{{if or .Runnable .HasSubCommands}}{{.UsageString}}{{end}}{{end}}`

// commandName is the command's path without "moeprep ": the error line
// already starts "moeprep: ".
func commandName(cmd *cobra.Command) string {
	return strings.TrimPrefix(cmd.CommandPath(), "moeprep ")
}

// argCount says how many arguments came: "none", "1 argument", "3 arguments".
func argCount(n int) string {
	switch n {
	case 0:
		return "none"
	case 1:
		return "1 argument"
	}
	return fmt.Sprintf("%d arguments", n)
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
