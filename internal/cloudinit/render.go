package cloudinit

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
)

// Input is what Render needs for one VM (or, with canonical Vars, for one
// template).
type Input struct {
	// Vars are the template variables.
	Vars Vars
	// UserData is spec.cloudInit.userData: a Go template rendering to a
	// #cloud-config document, a script or another cloud-init part, or a
	// MIME multipart document. Empty: only HyperFleet's cloud-config.
	UserData string
	// NetworkData is spec.cloudInit.networkData: a Go template rendering to
	// a network-config document. Used only with NetworkMode cloud-init,
	// where it is required.
	NetworkData string
	// MetaData is spec.cloudInit.metaData: a Go template rendering to a YAML
	// mapping of extra NoCloud meta-data keys.
	MetaData string
}

// Output is the NoCloud seed of one VM: the files of its cloud-init ISO.
type Output struct {
	// UserData is the user-data file: a #cloud-config document, or a MIME
	// multipart document when the user's data is not a cloud-config.
	UserData []byte
	// MetaData is the meta-data file: instance-id, local-hostname and the
	// user's extra keys.
	MetaData []byte
	// NetworkConfig is the network-config file (netplan version 2, or the
	// user's own document in cloud-init mode).
	NetworkConfig []byte
}

// Render renders the NoCloud seed. Errors about the user's templates are
// *Error values naming the template field (and line); other errors are
// about in.Vars. Both wrap their cause, except that an error whose text
// would show a piece of the VM's credential (a template that renders it
// where a message quotes the output) is replaced by one that does not,
// keeping only the field and line: errors end up in conditions and events.
func Render(in Input) (*Output, error) {
	out, err := render(in)
	if err != nil {
		return nil, withoutSecrets(err, in.Vars.secrets())
	}
	return out, nil
}

// withoutSecrets returns err, or, when its text shows a piece of a secret,
// an error that does not and that drops the cause (whose text would).
func withoutSecrets(err error, secrets []string) error {
	msg := err.Error()
	clean := agentconfig.RedactSecrets(msg, secrets...)
	if clean == msg {
		return err
	}
	var ce *Error
	if errors.As(err, &ce) {
		inner := agentconfig.RedactSecrets(ce.Err.Error(), secrets...)
		return &Error{Field: ce.Field, Line: ce.Line, Rendered: ce.Rendered, Err: errors.New(inner)}
	}
	return errors.New(clean)
}

func render(in Input) (*Output, error) {
	v := in.Vars
	nv, err := v.check()
	if err != nil {
		return nil, err
	}

	windows := v.GuestOS == GuestWindows
	switch v.GuestOS {
	case "", GuestLinux:
	case GuestWindows:
		if err := v.checkWindows(in); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("vars: GuestOS %q must be %s or %s", v.GuestOS, GuestLinux, GuestWindows)
	}

	var out Output
	// network-config
	switch v.NetworkMode {
	case NetworkCloudInit:
		if len(bytes.TrimSpace([]byte(in.NetworkData))) == 0 {
			return nil, &Error{Field: FieldNetworkData, Err: errors.New("is empty; network mode cloud-init takes the VM's network-config from it")}
		}
		nc, err := execute(FieldNetworkData, in.NetworkData, v)
		if err != nil {
			return nil, err
		}
		if err := checkUserNetwork(nc); err != nil {
			return nil, err
		}
		out.NetworkConfig = nc
	default:
		if in.NetworkData != "" {
			return nil, &Error{Field: FieldNetworkData, Err: fmt.Errorf("is used only with spec.network.mode cloud-init, but the mode is %s; remove it or switch the mode", v.NetworkMode)}
		}
		if out.NetworkConfig, err = renderNetwork(&v, nv); err != nil {
			return nil, err
		}
	}

	// meta-data
	var md []byte
	if in.MetaData != "" {
		if md, err = execute(FieldMetaData, in.MetaData, v); err != nil {
			return nil, err
		}
	}
	if out.MetaData, err = renderMetaData(&v, md); err != nil {
		return nil, err
	}

	// user-data
	if windows {
		if out.UserData, err = windowsUserData(&v); err != nil {
			return nil, err
		}
		return &out, nil
	}
	op, err := operatorCloudConfig(&v)
	if err != nil {
		return nil, err
	}
	var ud []byte
	if in.UserData != "" {
		if ud, err = execute(FieldUserData, in.UserData, v); err != nil {
			return nil, err
		}
	}
	if out.UserData, err = buildUserData(ud, op); err != nil {
		return nil, err
	}
	return &out, nil
}
