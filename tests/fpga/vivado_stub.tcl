# A recording stand-in for the Vivado Tcl commands the kit's build scripts use.
#
#   tclsh vivado_stub.tcl BUILD_TCL LOG_JSONL
#
# Sources BUILD_TCL with each Vivado command replaced by a proc that checks what Vivado would
# reject (order: project before sources before block design before runs; objects that must exist:
# files on disk, cells, pins of each IP as enabled by its CONFIG, address spaces; every pin of the
# accelerator and every enabled PS clock connected at validate_bd_design) and appends the call to
# LOG_JSONL as one JSON array per line. Exit status 0 when the script ran to its end, 1 with the
# error on stderr otherwise. Any command not defined here fails, so a typo fails the test too.
#
# Environment: STUB_BOARD_FILES=1 makes get_board_parts find the board; STUB_WNS sets the worst
# negative slack that timing queries return (default 0.250).

set ::build_tcl [file normalize [lindex $argv 0]]
set ::log_path [lindex $argv 1]
set ::log_fh [open $::log_path w]

proc json_str {s} {
    set s [string map [list \\ \\\\ \" \\\" \n \\n \r \\r \t \\t] $s]
    return "\"$s\""
}
proc record {args} {
    set items {}
    foreach a $args { lappend items [json_str $a] }
    puts $::log_fh "\[[join $items ", "]\]"
    flush $::log_fh
}
proc fail {msg} { error "vivado-stub: $msg" }
proc need {cond msg} { if {![uplevel 1 [list expr $cond]]} { fail $msg } }

# ---- state ---------------------------------------------------------------------------------
set ::project ""
set ::proj_dir ""
set ::sources {}
set ::modules {}
set ::constrs {}
set ::bd ""
set ::bd_state ""          ;# "" | open | validated | saved | generated
set ::cells [dict create]  ;# name -> {kind vlnv|module config dict}
set ::connected [dict create]
set ::top ""
set ::run_state ""         ;# "" | launched | done | open

# Option parsing: returns a dict of -flags (value or 1) and the positional arguments as "args".
proc parse_opts {argv valued} {
    set opts [dict create]
    set pos {}
    for {set i 0} {$i < [llength $argv]} {incr i} {
        set a [lindex $argv $i]
        if {[string index $a 0] eq "-" && ![string is double -strict $a]} {
            if {[lsearch -exact $valued $a] >= 0} {
                incr i
                need {$i < [llength $argv]} "option $a needs a value"
                dict set opts $a [lindex $argv $i]
            } else {
                dict set opts $a 1
            }
        } else {
            lappend pos $a
        }
    }
    dict set opts args $pos
    return $opts
}

# Pins of the IPs the block design uses: name -> kind (pin|intf) and the CONFIG that enables it.
proc ip_pins {cell} {
    set kind [dict get $::cells $cell kind]
    set cfg [dict get $::cells $cell config]
    proc on {cfg key} { expr {[dict exists $cfg CONFIG.$key] && [dict get $cfg CONFIG.$key] eq "1"} }
    set pins [dict create]
    switch -glob -- $kind {
        xilinx.com:ip:processing_system7:* {
            foreach p {FCLK_CLK0 FCLK_RESET0_N} { dict set pins $p pin }
            foreach p {DDR FIXED_IO} { dict set pins $p intf }
            if {![dict exists $cfg CONFIG.PCW_USE_M_AXI_GP0] || [on $cfg PCW_USE_M_AXI_GP0]} {
                dict set pins M_AXI_GP0 intf; dict set pins M_AXI_GP0_ACLK clk
            }
            if {[on $cfg PCW_USE_S_AXI_HP0]} { dict set pins S_AXI_HP0 intf; dict set pins S_AXI_HP0_ACLK clk }
            if {[on $cfg PCW_USE_FABRIC_INTERRUPT] && [on $cfg PCW_IRQ_F2P_INTR]} { dict set pins IRQ_F2P pin }
        }
        xilinx.com:ip:zynq_ultra_ps_e:* {
            foreach p {pl_clk0 pl_resetn0} { dict set pins $p pin }
            if {![dict exists $cfg CONFIG.PSU__USE__M_AXI_GP0] || [on $cfg PSU__USE__M_AXI_GP0]} {
                dict set pins M_AXI_HPM0_FPD intf; dict set pins maxihpm0_fpd_aclk clk
            }
            if {![dict exists $cfg CONFIG.PSU__USE__M_AXI_GP1] || [on $cfg PSU__USE__M_AXI_GP1]} {
                dict set pins M_AXI_HPM1_FPD intf; dict set pins maxihpm1_fpd_aclk clk
            }
            if {[on $cfg PSU__USE__S_AXI_GP2]} { dict set pins S_AXI_HP0_FPD intf; dict set pins saxihp0_fpd_aclk clk }
            if {[on $cfg PSU__USE__IRQ0]} { dict set pins pl_ps_irq0 pin }
        }
        xilinx.com:ip:proc_sys_reset:* {
            foreach p {slowest_sync_clk ext_reset_in aux_reset_in mb_debug_sys_rst dcm_locked mb_reset
                       bus_struct_reset peripheral_reset interconnect_aresetn peripheral_aresetn} {
                dict set pins $p pin
            }
        }
        xilinx.com:ip:smartconnect:* {
            dict set pins aclk clk; dict set pins aresetn clk
            set nsi [expr {[dict exists $cfg CONFIG.NUM_SI] ? [dict get $cfg CONFIG.NUM_SI] : 1}]
            set nmi [expr {[dict exists $cfg CONFIG.NUM_MI] ? [dict get $cfg CONFIG.NUM_MI] : 1}]
            for {set i 0} {$i < $nsi} {incr i} { dict set pins [format S%02d_AXI $i] intf }
            for {set i 0} {$i < $nmi} {incr i} { dict set pins [format M%02d_AXI $i] intf }
        }
        module:* {
            set pins [dict get $::cells $cell pins]
        }
        default { fail "no pin table for IP $kind" }
    }
    return $pins
}

# Ports of a Verilog module in the project's sources, grouped by X_INTERFACE_INFO aximm name.
proc module_pins {module} {
    foreach f $::sources {
        set fh [open $f]; set text [read $fh]; close $fh
        if {![regexp "module\\s+$module\\s*\\(" $text]} { continue }
        set pins [dict create]
        set pending ""
        set in_module 0
        foreach line [split $text \n] {
            if {[regexp "^\\s*module\\s+$module\\M" $line]} { set in_module 1; continue }
            if {!$in_module} continue
            if {[regexp {^\s*\);} $line]} break
            if {[regexp {X_INTERFACE_INFO = "xilinx.com:interface:aximm:1.0 (\w+) \w+"} $line -> intf]} {
                set pending $intf
                continue
            }
            if {[regexp {^\s*(input|output)\s+wire\s+(\[[^]]*\]\s*)?(\w+)} $line -> dir range name]} {
                if {$pending ne ""} {
                    dict set pins $pending intf
                    set pending ""
                } else {
                    dict set pins $name pin
                }
            }
        }
        return $pins
    }
    fail "module $module is not defined in any project source ([join $::sources {, }])"
}

proc pin_obj {kind path} {
    set parts [split [string trimleft $path /] /]
    need {[llength $parts] == 2} "bad pin path '$path' (expected cell/pin)"
    lassign $parts cell pin
    need {$::bd ne ""} "get_bd_${kind}s $path before create_bd_design"
    need {[dict exists $::cells $cell]} "no cell '$cell' in the block design (get_bd_${kind}s $path)"
    set pins [ip_pins $cell]
    need {[dict exists $pins $pin]} "cell $cell ([dict get $::cells $cell kind]) has no $kind '$pin' with its current CONFIG; it has [join [dict keys $pins] {, }]"
    set k [dict get $pins $pin]
    if {$kind eq "intf_pin"} {
        need {$k eq "intf"} "$path is not an interface pin"
    } else {
        need {$k ne "intf"} "$path is an interface pin; use get_bd_intf_pins"
    }
    return "$kind:/$cell/$pin"
}

# ---- project -------------------------------------------------------------------------------
proc version {args} { record version {*}$args; return 2022.1 }
proc create_project {args} {
    record create_project {*}$args
    set o [parse_opts $args {-part}]
    need {$::project eq ""} "create_project called twice"
    need {[dict exists $o -part] && [dict get $o -part] ne ""} "create_project without -part"
    lassign [dict get $o args] name dir
    need {$name ne "" && $dir ne ""} "create_project needs a name and a directory"
    set ::project $name
    set ::proj_dir $dir
    file mkdir $dir
    return "project:$name"
}
proc current_project {args} { record current_project {*}$args; need {$::project ne ""} "no open project"; return "project:$::project" }
proc current_fileset {args} { record current_fileset {*}$args; need {$::project ne ""} "no open project"; return "fileset:sources_1" }
proc get_board_parts {args} {
    record get_board_parts {*}$args
    set o [parse_opts $args {}]
    if {[info exists ::env(STUB_BOARD_FILES)] && $::env(STUB_BOARD_FILES) eq "1"} { return [lindex [dict get $o args] 0] }
    return ""
}
proc set_property {args} {
    record set_property {*}$args
    need {$::project ne ""} "set_property before create_project"
    if {[lindex $args 0] eq "-dict"} {
        set kv [lindex $args 1]
        set objs [lrange $args 2 end]
    } else {
        set kv [list [lindex $args 0] [lindex $args 1]]
        set objs [lrange $args 2 end]
    }
    need {[llength $objs] == 1} "set_property needs exactly one object, got '$objs'"
    need {[llength $kv] % 2 == 0} "set_property -dict needs key/value pairs"
    set obj [lindex $objs 0]
    foreach {k v} $kv {
        need {[string first "\$" $v] < 0} "unsubstituted variable in property $k = $v"
    }
    switch -glob -- $obj {
        cell:* {
            set cell [string range $obj 5 end]
            need {[dict exists $::cells $cell]} "set_property on unknown cell $cell"
            foreach {k v} $kv {
                need {[string match CONFIG.* $k]} "cell property $k is not a CONFIG.* key"
                dict set ::cells $cell config $k $v
            }
        }
        fileset:* {
            foreach {k v} $kv {
                if {$k eq "top"} {
                    need {[lsearch -exact $::modules $v] >= 0} "top $v is not a module of the project ([join $::modules {, }])"
                    set ::top $v
                }
            }
        }
        project:* {}
        default { fail "set_property on '$obj', which is not an object a get_*/create_* command returned" }
    }
    return ""
}
proc add_files {args} {
    record add_files {*}$args
    need {$::project ne ""} "add_files before create_project"
    set o [parse_opts $args {-fileset}]
    set files [concat {*}[dict get $o args]]
    need {[llength $files] > 0} "add_files with no files"
    foreach f $files {
        need {[file exists $f]} "add_files: $f does not exist"
        if {[dict exists $o -fileset] && [dict get $o -fileset] eq "constrs_1"} {
            need {[file extension $f] eq ".xdc"} "constraint file $f is not .xdc"
            lappend ::constrs $f
        } else {
            need {[file extension $f] in {.v .sv .vhd}} "source $f is not HDL"
            lappend ::sources $f
            set fh [open $f]; set text [read $fh]; close $fh
            foreach {-> m} [regexp -all -inline {(?:^|\n)\s*module\s+(\w+)} $text] { lappend ::modules $m }
        }
    }
    return ""
}
proc update_compile_order {args} { record update_compile_order {*}$args; need {$::project ne ""} "update_compile_order before create_project"; return "" }

# ---- block design ----------------------------------------------------------------------------
proc create_bd_design {args} {
    record create_bd_design {*}$args
    need {$::project ne ""} "create_bd_design before create_project"
    need {[llength $::sources] > 0} "create_bd_design before the RTL sources were added (module references need them)"
    set ::bd [lindex $args end]
    set ::bd_state open
    return "bd_design:$::bd"
}
proc current_bd_design {args} {
    record current_bd_design {*}$args
    need {$::bd ne ""} "current_bd_design with no block design"
    if {[llength $args]} { need {[lindex $args end] eq $::bd} "no block design [lindex $args end]" }
    return "bd_design:$::bd"
}
proc create_bd_cell {args} {
    record create_bd_cell {*}$args
    need {$::bd_state eq "open"} "create_bd_cell with no open, unsaved block design"
    set o [parse_opts $args {-type -vlnv -reference}]
    set name [lindex [dict get $o args] 0]
    need {$name ne ""} "create_bd_cell without a name"
    need {![dict exists $::cells $name]} "cell $name created twice"
    switch -- [dict get $o -type] {
        ip {
            need {[dict exists $o -vlnv]} "create_bd_cell -type ip without -vlnv"
            dict set ::cells $name [dict create kind [dict get $o -vlnv] config [dict create]]
        }
        module {
            need {[dict exists $o -reference]} "create_bd_cell -type module without -reference"
            set ref [dict get $o -reference]
            set pins [module_pins $ref]
            dict set ::cells $name [dict create kind module:$ref config [dict create] pins $pins]
        }
        default { fail "create_bd_cell -type [dict get $o -type]" }
    }
    ip_pins $name ;# the IP must be one the stub knows
    return "cell:$name"
}
proc apply_bd_automation {args} {
    record apply_bd_automation {*}$args
    set o [parse_opts $args {-rule -config}]
    need {[dict exists $o -rule]} "apply_bd_automation without -rule"
    if {[dict exists $o -config]} {
        need {[string first "\$" [dict get $o -config]] < 0} "unsubstituted variable in -config: [dict get $o -config]"
    }
    set obj [lindex [dict get $o args] 0]
    need {[string match cell:* $obj] && [dict exists $::cells [string range $obj 5 end]]} "apply_bd_automation on '$obj'"
    return ""
}
proc get_bd_pins {args} { record get_bd_pins {*}$args; set r {}; foreach p $args { lappend r [pin_obj pin $p] }; return $r }
proc get_bd_intf_pins {args} { record get_bd_intf_pins {*}$args; set r {}; foreach p $args { lappend r [pin_obj intf_pin $p] }; return $r }
proc connect_net {kind args} {
    set o [parse_opts $args {-net -intf_net}]
    set objs [concat {*}[dict get $o args]]
    need {[llength $objs] >= 2} "$kind needs at least two pins, got '$objs'"
    foreach obj $objs {
        if {$kind eq "connect_bd_intf_net"} {
            need {[string match intf_pin:* $obj]} "$kind: '$obj' is not an interface pin"
        } else {
            need {[string match pin:* $obj]} "$kind: '$obj' is not a pin"
        }
        need {![dict exists $::connected $obj]} "$obj connected twice"
        dict set ::connected $obj 1
    }
    return ""
}
proc connect_bd_net {args} { record connect_bd_net {*}$args; need {$::bd_state eq "open"} "connect_bd_net outside an open block design"; connect_net connect_bd_net {*}$args }
proc connect_bd_intf_net {args} { record connect_bd_intf_net {*}$args; need {$::bd_state eq "open"} "connect_bd_intf_net outside an open block design"; connect_net connect_bd_intf_net {*}$args }
proc get_bd_addr_spaces {args} {
    record get_bd_addr_spaces {*}$args
    set path [lindex $args end]
    lassign [split $path /] cell space
    need {[dict exists $::cells $cell]} "get_bd_addr_spaces: no cell $cell"
    set kind [dict get $::cells $cell kind]
    if {[string match module:* $kind]} {
        need {[dict exists [dict get $::cells $cell pins] $space]} "get_bd_addr_spaces: $cell has no master interface $space"
    } else {
        need {$space eq "Data"} "get_bd_addr_spaces: $kind has no address space $space"
    }
    return "addr_space:$path"
}
proc get_bd_addr_segs {args} {
    record get_bd_addr_segs {*}$args
    set path [lindex $args end]
    set parts [split $path /]
    set cell [lindex $parts 0]
    need {[dict exists $::cells $cell]} "get_bd_addr_segs: no cell $cell"
    set kind [dict get $::cells $cell kind]
    if {[string match module:* $kind]} {
        need {[llength $parts] == 3 && [lindex $parts 2] eq "reg0"} "get_bd_addr_segs: $path (a module reference's slave segment is <intf>/reg0)"
        need {[dict exists [dict get $::cells $cell pins] [lindex $parts 1]]} "get_bd_addr_segs: $cell has no interface [lindex $parts 1]"
    } else {
        set known {S_AXI_HP0/HP0_DDR_LOWOCM SAXIGP2/HP0_DDR_LOW}
        need {[lsearch -exact $known [join [lrange $parts 1 end] /]] >= 0} "get_bd_addr_segs: unknown segment $path"
    }
    return "addr_seg:$path"
}
proc assign_bd_address {args} {
    record assign_bd_address {*}$args
    need {$::bd_state eq "open"} "assign_bd_address outside an open block design"
    set o [parse_opts $args {-target_address_space -offset -range}]
    if {[dict exists $o -target_address_space]} {
        need {[string match addr_space:* [dict get $o -target_address_space]]} "assign_bd_address: bad -target_address_space"
    }
    if {[dict exists $o -offset]} {
        need {[string is wide -strict [dict get $o -offset]]} "assign_bd_address: bad -offset [dict get $o -offset]"
        need {[dict exists $o -range] && [regexp {^\d+[KMG]?$} [dict get $o -range]]} "assign_bd_address: -offset without a valid -range"
    }
    foreach s [dict get $o args] { need {[string match addr_seg:* $s]} "assign_bd_address: '$s' is not a segment" }
    return ""
}
proc validate_bd_design {args} {
    record validate_bd_design {*}$args
    need {$::bd_state eq "open"} "validate_bd_design with no open block design"
    dict for {cell info} $::cells {
        set kind [dict get $info kind]
        dict for {pin k} [ip_pins $cell] {
            set obj [expr {$k eq "intf" ? "intf_pin:/$cell/$pin" : "pin:/$cell/$pin"}]
            set must [expr {[string match module:* $kind] || $k eq "clk" ||
                            ([string match *smartconnect* $kind] && $k eq "intf")}]
            if {$must && ![dict exists $::connected $obj]} { fail "validate_bd_design: $cell/$pin is not connected" }
        }
    }
    set ::bd_state validated
    return ""
}
proc save_bd_design {args} {
    record save_bd_design {*}$args
    need {$::bd_state eq "validated"} "save_bd_design before validate_bd_design"
    set ::bd_state saved
    return ""
}

# ---- outputs and runs --------------------------------------------------------------------------
proc bd_path {} { return [file join $::proj_dir $::project.srcs sources_1 bd $::bd $::bd.bd] }
proc get_files {args} {
    record get_files {*}$args
    need {$::project ne ""} "get_files before create_project"
    set o [parse_opts $args {-of_objects}]
    set pat [lindex [dict get $o args] end]
    if {[string match *.bd $pat]} {
        need {$::bd_state in {saved generated}} "get_files $pat: the block design is not saved"
        need {[string match $pat $::bd.bd]} "get_files $pat: no such file"
        return [bd_path]
    }
    if {[string match *.hwh $pat]} {
        need {$::bd_state eq "generated"} "get_files $pat before generate_target"
        set f [file join [file dirname [bd_path]] hw_handoff $::bd.hwh]
        file mkdir [file dirname $f]
        set fh [open $f w]; puts $fh "<stub hwh/>"; close $fh
        return $f
    }
    fail "get_files $pat: the stub knows .bd and .hwh files only"
}
proc generate_target {args} {
    record generate_target {*}$args
    need {$::bd_state in {saved generated}} "generate_target before save_bd_design"
    need {[lindex $args end] eq [bd_path]} "generate_target on [lindex $args end], not the block design"
    set ::bd_state generated
    return ""
}
proc make_wrapper {args} {
    record make_wrapper {*}$args
    set o [parse_opts $args {-files}]
    need {$::bd_state in {saved generated}} "make_wrapper before save_bd_design"
    need {[dict exists $o -files] && [dict get $o -files] eq [bd_path]} "make_wrapper -files is not the block design"
    lappend ::modules ${::bd}_wrapper
    return ""
}
proc get_runs {args} { record get_runs {*}$args; need {[lindex $args end] eq "impl_1"} "get_runs [lindex $args end]"; return "run:impl_1" }
proc run_dir {} { return [file join $::proj_dir $::project.runs impl_1] }
proc launch_runs {args} {
    record launch_runs {*}$args
    set o [parse_opts $args {-to_step -jobs}]
    need {[lindex [dict get $o args] 0] eq "impl_1"} "launch_runs [dict get $o args]"
    need {$::top eq "${::bd}_wrapper"} "launch_runs with top '$::top', not the block design's wrapper"
    need {$::bd_state eq "generated"} "launch_runs before generate_target"
    need {[dict exists $o -jobs] && [string is integer -strict [dict get $o -jobs]]} "launch_runs: bad -jobs"
    set ::run_state launched
    return ""
}
proc wait_on_run {args} {
    record wait_on_run {*}$args
    need {$::run_state eq "launched"} "wait_on_run before launch_runs"
    file mkdir [run_dir]
    set fh [open [file join [run_dir] $::top.bit] w]; puts $fh "stub bitstream"; close $fh
    set ::run_state done
    return ""
}
proc open_run {args} { record open_run {*}$args; need {$::run_state in {done open}} "open_run before the run finished"; set ::run_state open; return "" }
proc get_timing_paths {args} { record get_timing_paths {*}$args; need {$::run_state eq "open"} "get_timing_paths before open_run"; return "timing_path:worst" }
proc get_property {args} {
    record get_property {*}$args
    lassign $args prop obj
    switch -glob -- "$prop $obj" {
        "PROGRESS run:*" { return [expr {$::run_state in {done open} ? "100%" : "0%"}] }
        "DIRECTORY run:*" { return [run_dir] }
        "SLACK timing_path:*" { return [expr {[info exists ::env(STUB_WNS)] ? $::env(STUB_WNS) : 0.250}] }
        default { fail "get_property $prop $obj: not modelled" }
    }
}
proc report_to_file {cmd args} {
    need {$::run_state eq "open"} "$cmd before open_run"
    set o [parse_opts $args {-file}]
    need {[dict exists $o -file]} "$cmd without -file"
    set f [dict get $o -file]
    need {[file isdirectory [file dirname $f]]} "$cmd: directory of $f does not exist"
    set fh [open $f w]; puts $fh "stub $cmd"; close $fh
    return ""
}
proc report_utilization {args} { record report_utilization {*}$args; report_to_file report_utilization {*}$args }
proc report_timing_summary {args} { record report_timing_summary {*}$args; report_to_file report_timing_summary {*}$args }
proc write_hw_platform {args} {
    record write_hw_platform {*}$args
    need {$::run_state in {done open}} "write_hw_platform before the bitstream exists"
    set o [parse_opts $args {-file}]
    need {[dict exists $o -fixed] && [dict exists $o -include_bit]} "write_hw_platform: PYNQ needs -fixed -include_bit"
    set f [dict get $o -file]
    need {[file isdirectory [file dirname $f]]} "write_hw_platform: directory of $f does not exist"
    set fh [open $f w]; puts $fh "stub xsa"; close $fh
    return ""
}

# Anything else is not a command this stub (or, as far as the kit knows, Vivado) provides.
rename unknown _tcl_unknown
proc unknown {args} { fail "unknown command '[lindex $args 0]'" }

set rc [catch {source $::build_tcl} msg opts]
if {$rc == 1} {
    puts stderr $msg
    puts stderr [dict get $opts -errorinfo]
    close $::log_fh
    exit 1
}
record END
close $::log_fh
exit 0
