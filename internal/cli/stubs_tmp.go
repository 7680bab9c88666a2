package cli

import "github.com/spf13/cobra"

func doctorCmd(g *globals) *cobra.Command { return &cobra.Command{Use: "doctor"} }
func gcCmd(g *globals) *cobra.Command     { return &cobra.Command{Use: "gc"} }
func imageCmd(g *globals) *cobra.Command  { return &cobra.Command{Use: "image"} }
